"""`python -m posym`: the same as the `posym` console script."""

from posym.cli import main

main()
