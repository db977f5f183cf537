"""A plugin module that fails to import: discovery must report it, not crash."""

raise ImportError("this dummy plugin is broken on purpose")
