"""Old entry point kept so existing links work; the page is dashboard/pages/5_Trajectories.py."""
from dashboard import run_page

run_page("5_Trajectories.py")
