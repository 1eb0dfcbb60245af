"""Old entry point kept so existing links work; the page is dashboard/pages/6_Export.py."""
from dashboard import run_page

run_page("6_Export.py")
