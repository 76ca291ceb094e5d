"""The compare page (see app/views/compare.py); app/main.py put the sidebar's selection in session state."""

from app.views import compare
from app.views.common import current

compare.render(current())
