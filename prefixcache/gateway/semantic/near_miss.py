"""A hand-built evaluation set of near-misses: pairs that look alike and need different answers.

``NEAR_MISSES``: (kind, text_a, text_b), kinds "entity", "negation", "number", "reversed";
serving text_a's answer for text_b is always wrong. ``PARAPHRASES``: pairs with the same
meaning (the answer may be shared), to see what the second check costs in recall.
``NEAR_MISSES_HELD_OUT``: 20 more near-misses, never used to tune the verifier.
Quora pairs (qqp_pairs) barely contain these cases (its SOURCE.md says so).
"""
from __future__ import annotations

_ENTITY = """\
What is the refund window for EU orders?|What is the refund window for US orders?
How do I reset my password on Windows?|How do I reset my password on Mac?
What is the capital of Austria?|What is the capital of Australia?
How much does shipping to Canada cost?|How much does shipping to Mexico cost?
Who is the CEO of Google?|Who is the CEO of Microsoft?
What time does the Berlin office open?|What time does the Munich office open?
How do I install Docker on Ubuntu?|How do I install Docker on Fedora?
What is the VAT rate in France?|What is the VAT rate in Germany?
Does the Pro plan include SSO?|Does the Basic plan include SSO?
How do I sort a list in Python?|How do I sort a list in Java?
What is the population of Spain?|What is the population of Portugal?
When does the store in London close?|When does the store in Paris close?
Is the iPhone waterproof?|Is the Pixel waterproof?
How do I cancel my Netflix subscription?|How do I cancel my Spotify subscription?
What are the side effects of ibuprofen?|What are the side effects of Aspirin?"""
_NEGATION = """\
How do I check if a column is NULL in SQL?|How do I check if a column is not NULL in SQL?
Which foods are safe for dogs?|Which foods are not safe for dogs?
Can I return an item after 30 days?|Can't I return an item after 30 days?
Why does my code compile?|Why doesn't my code compile?
Is it safe to drink tap water in Rome?|Is it not safe to drink tap water in Rome?
Which countries require a visa for US citizens?|Which do not require a visa for US citizens?
How do I keep a process running after logout?|How do I stop a process running after logout?
Should I take the medicine with food?|Should I take the medicine without food?
What happens if I pay my card bill on time?|What happens if I never pay my card bill on time?
Is the museum open on Mondays?|Is the museum closed on Mondays?
Does the warranty cover water damage?|Does the warranty not cover water damage?
Which plants need direct sunlight?|Which plants need no direct sunlight?
Is the API rate limited for free users?|Is the API not rate limited for free users?
Why is my phone charging?|Why isn't my phone charging?
Can I use the lounge with an economy ticket?|Can I never use the lounge with an economy ticket?"""
_NUMBER = """\
What is 15% of 200?|What is 15% of 300?
How many calories are in 2 eggs?|How many calories are in 3 eggs?
What is the weather forecast for the next 3 days?|What is the weather forecast for the next 10 days?
Convert 100 dollars to euros|Convert 1000 dollars to euros
What was the inflation rate in 2020?|What was the inflation rate in 2021?
What happens if I boil an egg for 5 minutes?|What happens if I boil an egg for 7 minutes?
Is a 2 year warranty included?|Is a 3 year warranty included?
How do I get to gate 12?|How do I get to gate 21?
What is the square root of 64?|What is the square root of 81?
Can I bring two bags on the plane?|Can I bring three bags on the plane?
What is the fee for a 1 hour parking?|What is the fee for a 4 hour parking?
How much is a ticket for 2 adults?|How much is a ticket for 4 adults?
What are the rules for the first week of trial?|What are the rules for the second week of trial?
Is 37.5 degrees a fever?|Is 38.5 degrees a fever?
How much RAM do I need for 8 users?|How much RAM do I need for 80 users?"""
_REVERSED = """\
Is Python faster than Java?|Is Java faster than Python?
How do I convert Celsius to Fahrenheit?|How do I convert Fahrenheit to Celsius?
How long is the flight from Paris to London?|How long is the flight from London to Paris?
How do I migrate from MySQL to Postgres?|How do I migrate from Postgres to MySQL?
Is a cat bigger than a fox?|Is a fox bigger than a cat?
How do I translate English to Spanish?|How do I translate Spanish to English?
Can I transfer money from savings to checking?|Can I transfer money from checking to savings?
Does coffee have more caffeine than tea?|Does tea have more caffeine than coffee?
Why did Rome defeat Carthage?|Why did Carthage defeat Rome?
What is the exchange rate from USD to EUR?|What is the exchange rate from EUR to USD?
Is gold heavier than lead?|Is lead heavier than gold?
How do I export contacts from Outlook to Gmail?|How do I export contacts from Gmail to Outlook?
Should I buy Apple stock?|Should I sell Apple stock?
Is the train before the bus?|Is the train after the bus?
What is the maximum dose of paracetamol?|What is the minimum dose of paracetamol?"""
# Written after the verifier was tuned on the four blocks above and never used to tune it.
_HELD_OUT = """\
entity|How do I renew my UK passport?|How do I renew my Irish passport?
entity|What is the baggage allowance on Ryanair?|What is the baggage allowance on EasyJet?
entity|Can I pay with PayPal?|Can I pay with Klarna?
entity|What is the phone number of the Boston branch?|What is the phone number of the Denver branch?
entity|How do I connect to the VPN on Linux?|How do I connect to the VPN on Android?
negation|Is the pool heated?|Is the pool not heated?
negation|Why does the app crash on startup?|Why doesn't the app crash on startup?
negation|Are pets allowed in the hotel?|Are pets not allowed in the hotel?
negation|Do I need a visa for Japan?|Do I not need a visa for Japan?
negation|Is breakfast included in the price?|Is breakfast excluded from the price?
number|Can I get a refund within 14 days?|Can I get a refund within 30 days?
number|What is the tax on a salary of 50,000?|What is the tax on a salary of 60,000?
number|How do I fix error 404?|How do I fix error 500?
number|How many seats are in row 7?|How many seats are in row 17?
number|Is the shop open on December 24?|Is the shop open on December 26?
reversed|Is Madrid older than Barcelona?|Is Barcelona older than Madrid?
reversed|How do I move files from Dropbox to Drive?|How do I move files from Drive to Dropbox?
reversed|How long is the train from Oslo to Bergen?|How long is the train from Bergen to Oslo?
reversed|Does the landlord pay the tenant for repairs?|Does the tenant pay the landlord for repairs?
reversed|Why did Sparta attack Athens?|Why did Athens attack Sparta?"""
_PARAPHRASE = """\
How do I reset my password?|How can I reset my password?
What is the refund window for EU orders?|How long is the refund window for EU orders?
How can I lose weight fast?|What is the fastest way to lose weight?
What is the best way to learn Python?|How should I learn Python?
How do I cancel my subscription?|How can I cancel my subscription?
What are the opening hours of the library?|When is the library open?
Why is my laptop so slow?|Why is my laptop running so slow?
How do I make a good cup of coffee?|How can I make a good cup of coffee?
What is the capital of Australia?|Which city is the capital of Australia?
How do I change my email address?|How can I change my email address?
Why isn't my phone charging?|Why is my phone not charging?
What should I pack for a trip to Japan?|What do I need to pack for a trip to Japan?
How do I delete my account?|How can I delete my account?
What is the price of the Pro plan?|How much does the Pro plan cost?
How do I improve my English writing?|How can I improve my English writing?
Is it safe to drink tap water in Rome?|Can I safely drink tap water in Rome?
What is machine learning?|What is machine learning exactly?
How do I get a refund?|How can I get a refund?
How do I export contacts from Outlook?|How can I export my contacts from Outlook?
What causes headaches?|What are the causes of headaches?"""


def _pairs(block: str) -> list[tuple[str, str]]:
    return [tuple(line.split("|")) for line in block.splitlines()]  # type: ignore[misc]


NEAR_MISSES: list[tuple[str, str, str]] = [
    (kind, a, b)
    for kind, block in (("entity", _ENTITY), ("negation", _NEGATION), ("number", _NUMBER),
                        ("reversed", _REVERSED))
    for a, b in _pairs(block)
]
NEAR_MISSES_HELD_OUT: list[tuple[str, str, str]] = [
    tuple(line.split("|")) for line in _HELD_OUT.splitlines()]  # type: ignore[misc]
PARAPHRASES: list[tuple[str, str]] = _pairs(_PARAPHRASE)
