"""Thin entry point kept beside the other pages; the page is dashboard/pages/7_Roles.py."""
from dashboard import run_page

run_page("7_Roles.py")
