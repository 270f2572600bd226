# Shell helpers shared by the long-running scripts (sourced, not run).

finished() {  # finished RUN_DIR: its training.json says the schedule ran to the end
  python -c "import json, sys; sys.exit(0 if json.load(open('$1/training.json')).get('finished') else 1)" 2>/dev/null
}
