"""Prefect flows: thin orchestration over ablate.runner (the work lives in ablate/)."""
