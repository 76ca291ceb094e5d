"""The overview page (see app/views/overview.py); app/main.py put the sidebar's selection in session state."""

from app.views import overview
from app.views.common import current

overview.render(current())
