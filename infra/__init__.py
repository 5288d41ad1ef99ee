"""Host providers: local processes, network namespaces, Docker, static SSH inventory."""
