"""``python -m gpufleet.cli``: the command without its installed script, as tests and benches run it."""

from gpufleet.cli import main

if __name__ == "__main__":  # importing it (as a walk over the package does) runs nothing
    main()
