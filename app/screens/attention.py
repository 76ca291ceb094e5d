"""The attention page (see app/views/attention.py); app/main.py put the sidebar's selection in session state."""

from app.views import attention
from app.views.common import current

attention.render(current())
