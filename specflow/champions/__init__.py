"""Persistence of the promoted answer: the champion and history files per traffic class, the
regression gate against the current champion, restore (`promote`). Writes files under a lock;
imports `specflow.decision` and below, no orchestration, tracking or engine.
"""
