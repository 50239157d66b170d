"""What an audit re-reads and what it trusts from an earlier one: by default nothing (:mod:`.reverify`)."""
