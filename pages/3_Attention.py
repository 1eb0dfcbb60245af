"""Old entry point kept so existing links work; the page is dashboard/pages/3_Attention.py."""
from dashboard import run_page

run_page("3_Attention.py")
