"""Orchestration: where trainers, engines and the router run (Ray), and the RL loop itself."""
