"""vime/GuessNumber-v0: hints, per-turn rewards, winning and losing."""

from __future__ import annotations

import pytest

import vime
from vime.data import TaskFileError


def test_binary_search_wins_with_per_turn_rewards():
    env = vime.make("vime/GuessNumber-v0")
    env.reset(options={"task": {"id": "g", "secret": 37}})
    low, high, rewards = 1, 100, []
    while True:
        guess = (low + high) // 2
        observation, reward, terminated, truncated, info = env.step(f"My guess is {guess}")
        rewards.append(reward)
        if terminated:
            break
        if "higher" in observation[0]["content"]:
            low = guess + 1
        else:
            high = guess - 1
    assert guess == 37 and info["won"] == 1.0 and truncated is False
    assert rewards == [0.1] * (len(rewards) - 1) + [1.0]
    assert observation == [
        {"role": "user", "content": f"Correct! The number was 37, found in {len(rewards)} guesses."}
    ]


def test_hints_say_higher_or_lower_and_count_guesses_left():
    env = vime.make("vime/GuessNumber-v0", max_guesses=5)
    env.reset(options={"task": {"id": "g", "secret": 60}})
    assert env.step("50")[0][0]["content"] == "50 is too low: higher. 4 guesses left."
    assert env.step("80")[0][0]["content"] == "80 is too high: lower. 3 guesses left."
    env.step("70")
    assert env.step("65")[0][0]["content"] == "65 is too high: lower. 1 guess left."


def test_guesses_that_ignore_the_hints_earn_nothing():
    env = vime.make("vime/GuessNumber-v0")
    env.reset(options={"task": {"id": "g", "secret": 60}})
    env.step("50")
    _, reward, _, _, info = env.step("40")
    assert reward == 0.0 and info["consistent_guess"] == 0.0


def test_a_reply_without_a_number_costs_a_guess():
    env = vime.make("vime/GuessNumber-v0")
    env.reset(seed=0)
    observation, reward, terminated, _, info = env.step("hmm, let me think")
    assert observation[0]["content"] == "I found no number in your reply. 6 guesses left."
    assert (reward, terminated, info["no_number"]) == (0.0, False, 1.0)


def test_running_out_of_guesses_terminates_the_game_as_lost():
    env = vime.make("vime/GuessNumber-v0", max_guesses=2)
    env.reset(options={"task": {"id": "g", "secret": 9}})
    assert env.step("5")[2] is False
    observation, reward, terminated, truncated, info = env.step("7")
    assert (terminated, truncated, info["won"], reward) == (True, False, 0.0, 0.1)
    assert observation[0]["content"] == "7 is too low: higher. Out of guesses: the number was 9."


def test_the_seed_picks_the_secret():
    env = vime.make("vime/GuessNumber-v0", high=1000)
    secrets = [env.reset(seed=s)[1]["task_id"] for s in range(6)]
    assert secrets == [env.reset(seed=s)[1]["task_id"] for s in range(6)]
    assert len(set(secrets)) == 6 and all(s.startswith("guess-1000-") for s in secrets)


def test_bad_settings_and_tasks_are_rejected():
    with pytest.raises(ValueError, match="need high >= 2 and max_guesses >= 1, got 1 and 7"):
        vime.make("vime/GuessNumber-v0", high=1)
    with pytest.raises(TaskFileError, match=r"missing key\(s\) \['secret'\]"):
        vime.make("vime/GuessNumber-v0").reset(options={"task": {"id": "g"}})
