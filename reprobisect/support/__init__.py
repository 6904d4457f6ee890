"""Process-level plumbing shared by workflows and executors: signals, bounded output,
progress display, the cache folder, trust of foreign traces.
"""
