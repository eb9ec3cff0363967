"""custom_generate/generate.py, which transformers loads by path (a package, so that the wheel ships it)."""
