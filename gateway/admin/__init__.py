"""The admin plane: health, readiness, metrics, the JSON API, reload (Starlette on uvicorn)."""
