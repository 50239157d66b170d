"""The load stage: each file loaded by the framework's own loader in an isolated CPU child (:mod:`.loadtest`),
served by one process that has imported torch (:mod:`.server`)."""
