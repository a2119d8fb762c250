"""``vime/RepoFix-v0``: fix a bug in a real repository with tools, graded by hidden tests."""
