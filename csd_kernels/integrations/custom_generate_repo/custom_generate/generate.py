"""transformers' custom_generate entry: ``model.generate(**inputs, custom_generate=csd_kernels.integrations.
transformers.custom_generate_path(), trust_remote_code=True, mode="sjd", window=16, ...)``.

transformers copies this file into its modules cache and calls ``generate(model=..., **the generate arguments)``; the
work is csd_kernels.integrations.transformers.custom_generate (installed with the package)."""


def generate(model, *args, **kwargs):
    from csd_kernels.integrations.transformers import custom_generate

    return custom_generate(model, *args, **kwargs)
