from planner._entry import run

run()
