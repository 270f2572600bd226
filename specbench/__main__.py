"""`python -m specbench ...` (what `torchrun --nproc-per-node N -m specbench run ...` starts)."""

from specbench.cli import main

if __name__ == "__main__":
    main()
