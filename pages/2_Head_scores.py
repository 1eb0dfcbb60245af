"""Old entry point kept so existing links work; the page is dashboard/pages/2_Head_scores.py."""
from dashboard import run_page

run_page("2_Head_scores.py")
