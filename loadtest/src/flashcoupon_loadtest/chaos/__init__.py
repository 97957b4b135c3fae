"""`make chaos`: the same sustained burst under one injected fault per row, one checker, one
table (docs/reliability.md). Modules: `stack` (private servers), `workload` (shoppers),
`faults` (the rows), `runner` (one row end to end), `checker` (figures and verdict),
`report` (table and JSON), `__main__` (the command line).
"""
