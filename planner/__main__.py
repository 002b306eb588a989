from planner.cli.entry import run

run()
