"""The API's routers: queries, admin, health."""
