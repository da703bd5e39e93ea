"""The broker's web dashboard: a page, its JSON API and its admin actions, served from the broker's loop.

`http.py` serves HTTP with every cost bounded, `app.py` routes and authorizes, `views.py` turns the broker's
statistics into what the page shows, and `static/` holds the page itself (no build step, nothing fetched from
elsewhere). See docs/dashboard.md.
"""

from cronoq.broker.dashboard.app import BrokerParts, Dashboard, task_view

__all__ = ["BrokerParts", "Dashboard", "task_view"]
