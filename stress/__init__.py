"""The stress suite: python stress/run.py (its scenarios import each other as
the top-level package scenarios, stress/ being sys.path[0]).  A package so
that tests/stress can import the runner's sizes as stress.run."""
