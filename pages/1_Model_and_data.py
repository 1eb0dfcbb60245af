"""Old entry point kept so existing links work; the page is dashboard/pages/1_Model_and_data.py."""
from dashboard import run_page

run_page("1_Model_and_data.py")
