"""The dynamics page (see app/views/dynamics.py); app/main.py put the sidebar's selection in session state."""

from app.views import dynamics
from app.views.common import current

dynamics.render(current())
