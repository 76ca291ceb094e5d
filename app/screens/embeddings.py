"""The embeddings page (see app/views/embeddings.py); app/main.py put the sidebar's selection in session state."""

from app.views import embeddings
from app.views.common import current

embeddings.render(current())
