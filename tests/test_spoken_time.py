"""Times of day as said (needle_cy.spoken_time): the readings grounding narrows a time to."""
import pytest

from needle_cy.spoken_time import said_time_spans, said_times, time_renderings

HHMM = "^([01][0-9]|2[0-3]):[0-5][0-9]$"


@pytest.mark.parametrize("said, times", [
    ("Set a 5:15 pm alarm called gym.", [(17, 15)]),
    ("wake me up at 7am", [(7, 0)]),
    ("alarm at 7 a.m. please", [(7, 0)]),
    ("seven PM", [(19, 0)]),
    ("set my alarm for 19:30", [(19, 30)]),
    ("set my alarm for 07:05", [(7, 5)]),
    ("alarm for quarter to eight in the morning on saturday", [(7, 45)]),
    ("twenty-five to eleven p.m.", [(22, 35)]),
    ("ten past 6 in the evening", [(18, 10)]),
    ("half past seven this evening", [(19, 30)]),
    ("eight o'clock tonight", [(20, 0)]),
    ("tonight at 9", [(21, 0)]),
    ("eleven at night", [(23, 0)]),
    ("at 7 tomorrow morning", [(7, 0)]),
    ("six thirty in the morning", [(6, 30)]),
    ("12 am", [(0, 0)]),
    ("12 pm", [(12, 0)]),
    ("lunch at noon, bed by midnight", [(12, 0), (0, 0)]),
    # without a part of the day both halves are readings; the model chooses
    ("set an alarm for 6:30 on weekdays", [(6, 30), (18, 30)]),
    ("quarter to eight", [(7, 45), (19, 45)]),
    ("at 9 or at 10pm", [(22, 0), (9, 0), (21, 0)]),
])
def test_said_times(said, times):
    assert said_times(said) == times


@pytest.mark.parametrize("said", [
    "set a timer for two hours", "lights at 80 percent", "a 50 minute timer called focus",
    "volume to 7", "for 20 minutes", "at 5 degrees", "I am home", "add 2 eggs", "version 2.5",
    "at 10 and a half", "room 12:61", "a table for 7 at a Greek place",
])
def test_levels_durations_and_counts_are_not_times(said):
    assert said_times(said) == []


def test_spans_cover_the_time_and_its_part_of_the_day():
    said = "Set a 5:15 pm alarm called gym, and wake me at quarter to eight in the morning"
    assert [said[a:b] for a, b in said_time_spans(said)] == ["5:15 pm", "quarter to eight in the morning"]
    said = "lunch at noon or tonight at 9"
    assert [said[a:b] for a, b in said_time_spans(said)] == ["noon", "9"]


def test_renderings_follow_the_pattern():
    assert time_renderings([(7, 45), (19, 45)], HHMM) == ["07:45", "19:45"]
    assert time_renderings([(7, 5)], r"^\d{1,2}:\d{2}$") == ["07:05"]
    assert time_renderings([(7, 5)], r"^[1-9]:\d{2}$") == ["7:05"]
    assert time_renderings([(7, 5)], r"^\d{2}:\d{2}:\d{2}$") == ["07:05:00"]
    # not a time's pattern: a loose one that takes words, a PIN's, an invalid one
    assert time_renderings([(7, 45)], "^.{1,40}$") == []
    assert time_renderings([(7, 45)], "^[0-9]{4}$") == []
    assert time_renderings([(7, 45)], "(") == []


@pytest.mark.parametrize("said, minutes", [
    ("Timer for an hour and a half for the roast", [90]),
    ("set a 50 minute timer called focus", [50]),
    ("three quarters of an hour", [45]),
    ("a quarter of an hour", [15]),
    ("half an hour", [30]),
    ("one and a half hours", [90]),
    ("two hours and a half", [150]),
    ("a timer for 3 hours and forty-five minutes", [225]),        # one duration, not two
    ("Set a one hour and forty-five minute timer", [105]),
    ("an hour fifteen minutes", [75]),
    ("a two-hour timer", [120]),
    ("2 hrs", [120]),
    ("90 seconds", [1.5]),
    ("25 minutes of water and a 10 min timer", [25, 10]),
    ("Set an alarm for 6:30", []),
    ("lights at 80 percent", []),
])
def test_said_durations(said, minutes):
    from needle_cy.spoken_time import said_durations
    assert [s / 60 for s in said_durations(said)] == minutes
