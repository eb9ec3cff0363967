"""Small, real, CPU-sized models shipped with csd_kernels (see ``csd_kernels.zoo.digits``)."""
