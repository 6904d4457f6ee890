"""Version control: the git repository (revisions, worktrees, lock, archives) and DVC data.
"""
