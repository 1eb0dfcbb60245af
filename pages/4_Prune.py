"""Old entry point kept so existing links work; the page is dashboard/pages/4_Prune.py."""
from dashboard import run_page

run_page("4_Prune.py")
