"""quorumqueue's Spark connector: the `quorumqueue` streaming source (the sink comes next)."""
