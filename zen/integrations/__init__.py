"""Optional integrations with other libraries. Each module imports its library when it is imported itself,
never from `import zen`: `from zen.integrations.torchrec import ZenDataParallelWrapper`."""
