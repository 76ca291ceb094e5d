"""The lens page (see app/views/lens.py); app/main.py put the sidebar's selection in session state."""

from app.views import lens
from app.views.common import current

lens.render(current())
