"""headprune dashboard from a checkout: ``streamlit run app.py`` (the dashboard itself is dashboard/app.py)."""
from dashboard.app import main

main()
