"""The folder transformers' generate(custom_generate=...) takes (a package, so that the wheel ships it)."""
