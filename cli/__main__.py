"""`python -m quorumqueue.cli ...`: the `quorumqueue` command."""

from .main import main

main()
