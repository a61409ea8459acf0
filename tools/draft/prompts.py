"""Chat prompts for the draft head's training data (docs/draft.md, "Data").

    python -m draft.prompts --out FILE.jsonl --count N [--seed S] [--kinds K,...] [--wide] [--exclude F...]

Magpie prompts (the target writes its own user turns) are mostly requests for advice: a 135M
model rarely asks itself for code, arithmetic, a rewrite of a given sentence or a list. Users do,
and the head then drafts answers it has never seen. This writes N distinct user prompts of those
kinds from templates and word lists of this file (written for this project, never from the
benchmark set ../shared/data/prompts/), one JSON line each, {"id", "category", "messages"}, the
format `specula draft-data --prompts` and `bench spec` read. The answers are still the target's
own: only the questions come from here. Deterministic for a seed.
"""
from __future__ import annotations

import argparse
import json
import random
import sys

SUBJECTS = [
    "photosynthesis", "the water cycle", "plate tectonics", "black holes", "the immune system", "volcanoes",
    "the French Revolution", "the Roman Empire", "the printing press", "the industrial revolution", "inflation",
    "supply and demand", "compound interest", "machine learning", "the internet", "blockchain", "vaccines",
    "climate change", "renewable energy", "nuclear fission", "the moon's phases", "tides", "rainbows",
    "earthquakes", "the human heart", "DNA", "evolution", "gravity", "electricity", "magnetism", "sound waves",
    "the stock market", "democracy", "the Renaissance", "ancient Egypt", "the Silk Road", "the Cold War",
    "recycling", "composting", "sleep", "memory", "muscle growth", "nutrition", "coffee", "tea", "chocolate",
    "bread baking", "fermentation", "bees", "ants", "whales", "dinosaurs", "coral reefs", "rainforests", "deserts",
    "glaciers", "hurricanes", "lightning", "the northern lights", "satellites", "GPS", "solar panels",
    "wind turbines", "electric cars", "batteries", "airplanes", "submarines", "bridges", "skyscrapers",
    "the Olympic Games", "chess", "jazz", "opera", "impressionism", "poetry", "the novel", "photography",
    "cinema", "video games", "social media", "email", "encryption", "passwords", "databases", "operating systems",
    "compilers", "recursion", "sorting algorithms", "binary numbers", "prime numbers", "probability", "statistics",
    "the Pythagorean theorem", "fractions", "percentages", "taxes", "budgeting", "public speaking", "negotiation",
    "time management", "meditation", "yoga", "running", "swimming", "gardening", "houseplants", "bird migration",
    "the Great Wall of China", "the pyramids", "the Amazon river", "Mount Everest", "the Sahara", "Antarctica",
    "the solar system", "Mars", "Jupiter", "comets", "the speed of light", "time zones", "calendars", "maps",
    "languages", "grammar", "translation", "libraries", "museums", "architecture", "pottery", "knitting",
]

ACTIVITIES = [
    "learn a new language", "study for an exam", "cook rice", "make pancakes", "start running", "save money",
    "write a resume", "prepare for a job interview", "fall asleep faster", "keep houseplants alive",
    "organize a small kitchen", "plan a road trip", "learn to play guitar", "start a vegetable garden",
    "clean a laptop keyboard", "write a cover letter", "make new friends in a new city", "reduce screen time",
    "learn to code", "give a good presentation", "train a puppy", "brew coffee at home", "paint a room",
    "change a bike tire", "make a budget", "pack for a week-long trip", "stay focused while working from home",
    "read more books", "improve handwriting", "bake sourdough bread", "write a short story", "take better photos",
    "care for a cat", "set up a home network", "back up a computer", "learn chess", "make a smoothie",
    "stay hydrated", "prepare for a marathon", "host a dinner party", "learn to swim", "write a thank-you note",
]

THINGS = [
    "a refrigerator", "a microwave oven", "a bicycle", "a camera", "a telescope", "a compass", "a thermostat",
    "a credit card", "a search engine", "a vaccine", "a rocket", "a jet engine", "a heat pump", "a hard drive",
    "a touchscreen", "a battery", "a solar cell", "a lock and key", "a clock", "a printer", "Wi-Fi", "a web browser",
    "a submarine", "an elevator", "a parachute", "a piano", "a light bulb", "a car engine", "a wind turbine",
]

PAIRS = [
    ("a lake", "a pond"), ("weather", "climate"), ("a virus", "a worm in computing"), ("speed", "velocity"),
    ("mass", "weight"), ("a simile", "a metaphor"), ("RAM", "storage"), ("a crocodile", "an alligator"),
    ("baking soda", "baking powder"), ("a hurricane", "a tornado"), ("a democracy", "a republic"),
    ("an asteroid", "a meteor"), ("TCP", "UDP"), ("a list", "a tuple in Python"), ("stocks", "bonds"),
    ("a frog", "a toad"), ("an ocean", "a sea"), ("empathy", "sympathy"), ("a compiler", "an interpreter"),
    ("a rabbit", "a hare"), ("fission", "fusion"), ("AC", "DC current"), ("a county", "a country"),
    ("latitude", "longitude"), ("a cold", "the flu"), ("Git", "GitHub"), ("a noun", "a verb"),
]

PEOPLE = [
    "a busy student", "a retired teacher", "a new parent", "a software engineer", "a small business owner",
    "a nurse working night shifts", "a beginner cook", "a child who loves space", "a tourist in Paris",
    "someone who just moved to a new country", "a high school science class", "a group of hikers",
]

FORMS = ["poem", "haiku", "story", "limerick", "song chorus", "fable", "diary entry", "letter", "riddle"]
MOODS = ["cheerful", "calm", "mysterious", "funny", "hopeful", "sad", "dramatic", "gentle"]
CREATURES = ["a lonely robot", "a curious cat", "an old lighthouse keeper", "a dragon who is afraid of fire",
             "a lost balloon", "a talking tree", "a young astronaut", "a clever fox", "a snowman in spring",
             "a pirate who cannot swim", "a shy ghost", "a time traveller", "a bee who wants to sing"]

CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "returns the largest element of a list",
    "counts the vowels in a string", "computes the factorial of n", "returns the n-th Fibonacci number",
    "removes duplicates from a list while keeping order", "checks whether a word is a palindrome",
    "merges two sorted lists", "converts Celsius to Fahrenheit", "counts how often each word appears in a text",
    "finds the second smallest number in a list", "flattens a nested list", "computes the average of a list",
    "validates an email address with a simple rule", "sorts a list of names by length",
    "returns the greatest common divisor of two numbers", "checks whether two strings are anagrams",
    "reads a text file and prints its number of lines", "converts a binary string to an integer",
    "sums the digits of a number", "capitalizes the first letter of every word", "finds the missing number in 1..n",
]
LANGUAGES = ["Python", "Python", "Python", "JavaScript", "C", "Java", "Rust", "Go", "C++"]
CODE_CONCEPTS = ["a for loop", "a dictionary", "a class", "recursion", "a lambda function", "an exception",
                 "a pointer", "an array", "a hash table", "a linked list", "a stack", "a queue", "list comprehension",
                 "a variable", "a function", "an API", "a unit test", "version control", "a race condition"]

NAMES = ["Anna", "Ben", "Carla", "David", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jack", "Keiko", "Liam", "Maya",
         "Noah", "Olga", "Pedro", "Rosa", "Sam", "Tara", "Victor"]
ITEMS = ["apples", "pencils", "books", "cookies", "stickers", "marbles", "oranges", "tickets", "cards", "stamps"]

SENTENCES = [
    "the meeting has been moved to thursday afternoon because the room was not available",
    "i think we should leave early so we can get good seats at the concert",
    "our team finished the project two days before the deadline",
    "the weather was terrible but we still enjoyed the picnic",
    "please remember to bring your own water bottle to the hike",
    "the new library opens next monday and everyone is invited",
    "he forgot his keys at the office and had to wait outside for an hour",
    "we are happy to announce that the shop will stay open later on fridays",
    "the cat knocked a glass off the table while we were eating dinner",
    "she has been learning the piano for three years and plays every evening",
    "the train was delayed by forty minutes due to a signal problem",
    "thank you for your help with the move last weekend",
    "the results of the survey show that most people prefer working in the morning",
    "our neighbours planted a small garden with tomatoes and herbs",
    "the software update fixes several bugs and makes the app faster",
]
REWRITES = ["Rewrite this sentence in a formal tone", "Make this sentence shorter", "Rewrite this sentence for a child",
            "Fix the capitalization and punctuation of this sentence", "Turn this sentence into a question",
            "Rewrite this sentence in the past tense", "Rewrite this sentence more politely",
            "Translate this sentence into simple English", "Rewrite this sentence in a friendly, casual tone"]
COPIES = ["Repeat this sentence exactly, then say how many words it has", "Write this sentence in all capital letters",
          "Copy this sentence and put each word on its own line", "Repeat this text twice",
          "Write this sentence backwards, word by word", "Put this sentence in quotation marks and repeat it",
          "Add a full stop to the end of this sentence and repeat it"]

CHATS = [
    "Hi! How are you today?", "Good morning! Can you tell me something interesting?", "I'm bored. Any ideas?",
    "Tell me a joke.", "What's your favourite book and why?", "I had a long day at work.",
    "Can you recommend a movie for a rainy evening?", "I just adopted a puppy!", "What should I cook tonight?",
    "Do you like music?", "I can't decide what to do this weekend.", "Tell me a fun fact about animals.",
    "I'm nervous about my exam tomorrow.", "What's a good hobby to start?", "Can you cheer me up?",
    "What would you do with a free day?", "I finished my first marathon!", "Say something nice.",
]

# The wider lists (`--wide`, fourteenth session): the lists above were nearly used up (prompts.py
# could write only 817 new distinct prompts of the open kinds out of 1,600 asked). Without
# `--wide` the generator draws from the lists above alone, so every earlier seed still writes the
# same prompts; with it, each list is the one above plus its extension here, and every kind has
# further templates (below), among them formatting tasks: lists to reorder, number or copy, short
# texts to summarize or turn into a list, sentences to correct. Written for this project like the
# lists above; none is taken from the benchmark set.
WIDE = {
    "SUBJECTS": [
        "the digestive system", "the nervous system", "the lungs", "bones", "the skin", "blood types", "allergies",
        "antibiotics", "the common cold", "fever", "vitamins", "protein", "sugar", "salt", "caffeine", "hydration",
        "the ozone layer", "acid rain", "air pollution", "deforestation", "ocean currents", "the greenhouse effect",
        "wetlands", "savannas", "tundra", "mountains", "rivers", "caves", "islands", "soil", "fossils", "minerals",
        "crystals", "magnets", "friction", "inertia", "momentum", "energy", "heat", "temperature", "pressure",
        "density", "buoyancy", "atoms", "molecules", "chemical reactions", "acids and bases", "rust", "fire",
        "lasers", "radio waves", "microwaves", "X-rays", "telescopes", "microscopes", "the periodic table",
        "the Big Bang", "stars", "galaxies", "the Milky Way", "the sun", "eclipses", "meteor showers", "Saturn's rings",
        "the International Space Station", "astronauts", "the Apollo missions", "the telephone", "the radio",
        "television", "the steam engine", "the wheel", "writing", "money", "banks", "credit scores", "loans",
        "insurance", "mortgages", "retirement savings", "the economy", "trade", "globalization", "unemployment",
        "elections", "the United Nations", "human rights", "laws", "courts", "juries", "newspapers", "advertising",
        "marketing", "brands", "startups", "teamwork", "leadership", "motivation", "habits", "stress", "happiness",
        "friendship", "kindness", "curiosity", "creativity", "critical thinking", "logic", "philosophy", "ethics",
        "mythology", "Greek myths", "the Vikings", "the Middle Ages", "castles", "knights", "samurai", "the Aztecs",
        "the Maya civilization", "ancient Rome's roads", "the Titanic", "the moon landing", "the Wright brothers",
        "penguins", "owls", "elephants", "octopuses", "sharks", "dolphins", "wolves", "butterflies", "spiders",
        "snakes", "frogs", "camels", "kangaroos", "pandas", "horses", "dogs", "cats", "parrots", "migration",
        "hibernation", "camouflage", "food chains", "pollination", "seeds", "trees", "mushrooms", "algae",
        "bacteria", "cells", "genes", "twins", "the brain", "dreams", "emotions", "language learning", "reading",
        "handwriting", "spelling", "punctuation", "music theory", "the piano", "the violin", "drums", "rock music",
        "classical music", "hip hop", "dance", "ballet", "theatre", "Shakespeare", "fairy tales", "comics",
        "animation", "sculpture", "painting", "color theory", "fashion", "textiles", "cotton", "wool", "paper",
        "glass", "plastic", "steel", "concrete", "wood", "cheese", "rice", "pasta", "spices", "olive oil", "honey",
        "ice cream", "pizza", "sushi", "vegetarian diets", "farming", "irrigation", "tractors", "fishing",
        "forests", "national parks", "camping", "hiking", "cycling", "football", "basketball", "tennis",
        "the marathon", "the Tour de France", "cricket", "baseball", "skiing", "surfing", "board games", "puzzles",
        "magic tricks", "robots", "artificial intelligence", "chatbots", "smartphones", "apps", "cloud computing",
        "cybersecurity", "viruses in computing", "open source software", "programming languages", "HTML",
        "spreadsheets", "data science", "algorithms", "search engines", "3D printing", "drones", "self-driving cars",
        "trains", "ships", "traffic lights", "roads", "tunnels", "dams", "canals", "lighthouses", "ports",
        "airports", "cities", "villages", "population growth", "water treatment", "sewers", "electricity grids",
    ],
    "ACTIVITIES": [
        "make a cup of tea", "boil an egg", "make a salad", "cook pasta", "bake cookies", "make soup", "grill vegetables",
        "make bread without yeast", "store fresh herbs", "sharpen a kitchen knife", "clean an oven", "do laundry",
        "remove a coffee stain", "iron a shirt", "fold a fitted sheet", "declutter a closet", "clean windows",
        "fix a leaking tap", "hang a picture", "assemble flat-pack furniture", "unclog a sink", "save energy at home",
        "grow herbs on a windowsill", "repot a plant", "attract birds to a garden", "start composting",
        "walk ten thousand steps a day", "stretch after exercise", "start lifting weights", "improve posture",
        "eat more vegetables", "drink less coffee", "wake up early", "build a morning habit", "manage stress",
        "stop procrastinating", "take good notes", "memorize a speech", "learn vocabulary faster", "write an essay",
        "write a good email", "ask for a raise", "run a meeting", "give feedback", "make a to-do list",
        "plan a birthday party", "choose a gift for a friend", "plan a picnic", "plan a week of meals",
        "save for a holiday", "track expenses", "open a savings account", "compare phone plans", "sell old clothes",
        "learn to draw", "learn to juggle", "learn to knit", "start a blog", "edit a video", "record a podcast",
        "make a website", "learn Python", "learn SQL", "speed up a slow computer", "choose a strong password",
        "protect my privacy online", "spot a phishing email", "organize digital photos", "free up phone storage",
        "teach a child to ride a bike", "help a child with homework", "talk to a teenager about screen time",
        "welcome a new neighbour", "apologize to a friend", "make small talk", "stay in touch with old friends",
        "prepare for a long flight", "beat jet lag", "travel on a budget", "learn to camp", "read a map",
        "prepare for a storm", "make a first aid kit", "care for a goldfish", "walk a dog safely in the heat",
    ],
    "THINGS": [
        "a dishwasher", "a washing machine", "a vacuum cleaner", "a toaster", "a kettle", "an air conditioner",
        "a smoke detector", "a doorbell camera", "a smartphone", "a keyboard", "a computer mouse", "a QR code",
        "a barcode scanner", "an ATM", "a vending machine", "a traffic light", "a speed camera", "a train signal",
        "a satellite dish", "a radio", "a microphone", "a loudspeaker", "headphones", "a hearing aid", "glasses",
        "a thermometer", "a barometer", "a scale", "a seatbelt", "an airbag", "brakes", "a gearbox", "a hybrid car",
        "a helicopter", "a hot air balloon", "a sailboat", "a canal lock", "a dam", "a water tower",
        "a nuclear power plant", "a power grid", "a fuse", "an electric motor", "a generator", "a transformer",
        "a solar water heater", "a 3D printer", "a robot vacuum", "a smartwatch", "a fitness tracker",
    ],
    "PAIRS": [
        ("a planet", "a star"), ("a comet", "an asteroid"), ("bacteria", "viruses"), ("an atom", "a molecule"),
        ("heat", "temperature"), ("an acid", "a base"), ("a solid", "a liquid"), ("a mammal", "a reptile"),
        ("a moth", "a butterfly"), ("a dolphin", "a porpoise"), ("a lake", "a reservoir"), ("a hill", "a mountain"),
        ("a city", "a town"), ("a loan", "a grant"), ("saving", "investing"), ("income", "profit"),
        ("a debit card", "a credit card"), ("a want", "a need"), ("a fact", "an opinion"), ("a theory", "a hypothesis"),
        ("an adjective", "an adverb"), ("a poem", "a song"), ("a novel", "a short story"), ("a play", "a film"),
        ("hardware", "software"), ("a website", "an app"), ("a router", "a modem"), ("HTTP", "HTTPS"),
        ("a bug", "a feature"), ("a function", "a method"), ("Python", "JavaScript"), ("a byte", "a bit"),
        ("jogging", "running"), ("stretching", "warming up"), ("a diet", "a meal plan"), ("baking", "roasting"),
        ("a herb", "a spice"), ("a fruit", "a vegetable"), ("a cake", "a bread"), ("coffee", "espresso"),
    ],
    "PEOPLE": [
        "a teenager", "a grandparent", "a first-year university student", "a farmer", "a musician", "a painter",
        "a shop assistant", "a bus driver", "a visitor from another planet", "a ten-year-old", "a football fan",
        "a librarian", "a chef", "a pilot", "someone learning English", "a person who has never used a computer",
    ],
    "FORMS": ["short poem", "ballad", "bedtime story", "postcard", "speech", "toast", "advertisement", "news report",
              "dialogue", "two-sentence story", "acrostic poem", "lullaby"],
    "MOODS": ["joyful", "nostalgic", "spooky", "silly", "peaceful", "adventurous", "thoughtful", "romantic"],
    "CREATURES": [
        "a brave little mouse", "a forgetful wizard", "a robot who wants to paint", "a penguin who hates the cold",
        "a tiny dragon", "an owl who cannot sleep at night", "a kind giant", "a squirrel who saves everything",
        "a detective dog", "a cloud that wants to be a rainbow", "a mermaid who visits a city", "an old tortoise",
        "a princess who builds machines", "a lost star", "a baker who bakes magic bread", "two rival snails",
        "a lighthouse cat", "a turtle in a race", "a fox and a crow", "a homesick alien", "a shy volcano",
    ],
    "CODE_TASKS": [
        "returns the smallest element of a list", "counts the words in a sentence", "reverses the words of a sentence",
        "checks whether a year is a leap year", "converts minutes to hours and minutes", "returns the even numbers of a list",
        "multiplies every element of a list by two", "checks whether a list is sorted", "finds the index of an element",
        "returns the length of the longest word", "removes spaces from a string", "counts the uppercase letters in a string",
        "returns a dictionary of letter counts", "computes the power of a number without a built-in",
        "prints a multiplication table", "prints the numbers from 1 to 100 that are divisible by 7",
        "returns the product of a list", "converts a list of strings to upper case", "swaps the keys and values of a dictionary",
        "computes the median of a list", "rotates a list by k positions", "checks whether a number is a perfect square",
        "returns the intersection of two lists", "generates a random password", "converts Fahrenheit to Celsius",
        "computes simple interest", "returns the last n elements of a list", "splits a list into chunks of size n",
    ],
    "LANGUAGES": ["Python", "JavaScript", "TypeScript", "C#", "Ruby", "Kotlin", "Swift", "PHP"],
    "CODE_CONCEPTS": ["a while loop", "an if statement", "a string", "a boolean", "a tuple", "a set", "a module",
                      "inheritance", "an interface", "a constructor", "a callback", "a promise", "a thread",
                      "a database index", "an algorithm's time complexity", "a binary search", "a tree", "a graph",
                      "a loop counter", "a global variable", "an import", "a type error", "a syntax error", "a return value"],
    "NAMES": ["Aisha", "Bruno", "Chen", "Dina", "Elias", "Fatima", "Gustav", "Hana", "Ivan", "Julia", "Kofi", "Lena",
              "Mateo", "Nadia", "Omar", "Priya", "Quentin", "Ravi", "Sofia", "Tom", "Uma", "Wei", "Yusuf", "Zoe"],
    "ITEMS": ["eggs", "bananas", "crayons", "coins", "shells", "candles", "balloons", "buttons", "cupcakes", "plates",
              "chairs", "flowers", "bottles", "notebooks", "toy cars"],
    "SENTENCES": [
        "the bakery on the corner sells fresh bread every morning before seven",
        "my brother wants to become a pilot when he finishes school",
        "the museum will host a free concert in the garden on sunday",
        "we painted the kitchen yellow and bought new curtains",
        "the bus driver waited for the old man to find his seat",
        "our flight was cancelled so we stayed one more night at the hotel",
        "the children built a sandcastle that was taller than their father",
        "the company hired ten new engineers this year",
        "she answered every question in the quiz correctly",
        "the park is closed today because of the strong wind",
        "i left my umbrella on the train this morning",
        "the recipe needs two cups of flour and one cup of milk",
        "the doctor said i should drink more water and walk every day",
        "the students planted trees along the river last spring",
        "my phone battery died in the middle of the call",
        "the team celebrated their victory with a big dinner",
    ],
    "REWRITES": ["Rewrite this sentence in the future tense", "Rewrite this sentence in the passive voice",
                 "Make this sentence more exciting", "Rewrite this sentence as a headline",
                 "Rewrite this sentence using simpler words", "Make this sentence sound more professional",
                 "Rewrite this sentence as if a pirate said it", "Paraphrase this sentence",
                 "Rewrite this sentence in the first person", "Expand this sentence into two sentences"],
    "COPIES": ["Write this sentence in all lowercase letters", "Repeat this sentence and underline nothing, just copy it",
               "Write this text again and number each sentence", "Copy this text, then count its sentences",
               "Write this sentence three times", "Copy this sentence and replace every space with a dash",
               "Repeat this text, then give it a title"],
    "CHATS": [
        "Hello! What can you help me with?", "Good evening! How was your day?", "I'm learning to cook. Any advice?",
        "Tell me something that will make me smile.", "What's a good way to relax after work?",
        "I just got a new job!", "My friend's birthday is tomorrow. What should I write in the card?",
        "Can you suggest a name for my goldfish?", "I can't sleep. Talk to me for a bit.",
        "What's your favourite season and why?", "Tell me a riddle.", "Give me a fun fact about space.",
        "I want to learn something new today.", "Do you have any advice for a first date?",
        "What's a good game to play with friends?", "I'm moving to a new city next month.",
        "Tell me a short motivational quote.", "What's the weirdest animal you know of?",
        "Suggest a book for a long train ride.", "I failed my driving test today.", "Tell me a joke about cats.",
        "What would be a fun theme for a party?", "Help me choose between a cat and a dog.",
    ],
}

# Things to put in order, copy, number or list again (formatting tasks, `--wide` only).
SEQUENCES = [
    ("the months of the year", ["January", "February", "March", "April", "May", "June", "July", "August",
                                 "September", "October", "November", "December"]),
    ("the planets in order from the sun", ["Mercury", "Venus", "Earth", "Mars", "Jupiter", "Saturn", "Uranus", "Neptune"]),
    ("the colors of the rainbow", ["red", "orange", "yellow", "green", "blue", "indigo", "violet"]),
    ("the four seasons", ["spring", "summer", "autumn", "winter"]),
    ("the continents", ["Africa", "Antarctica", "Asia", "Australia", "Europe", "North America", "South America"]),
    ("the first eight even numbers", ["2", "4", "6", "8", "10", "12", "14", "16"]),
    ("the vowels of the English alphabet", ["a", "e", "i", "o", "u"]),
]
GROUPS = [["flour", "sugar", "butter", "eggs", "vanilla", "baking powder"],
          ["tent", "sleeping bag", "torch", "water bottle", "map", "snacks", "rain jacket"],
          ["pencils", "notebook", "eraser", "ruler", "scissors", "glue"],
          ["tomatoes", "onions", "garlic", "peppers", "olive oil", "basil"],
          ["passport", "tickets", "charger", "sunscreen", "toothbrush", "book"],
          ["soap", "towels", "shampoo", "toothpaste", "tissues"],
          ["Paris", "Rome", "Madrid", "Berlin", "Vienna", "Prague"],
          ["lion", "zebra", "giraffe", "elephant", "hippo", "rhino"],
          ["wash the car", "buy groceries", "call the bank", "water the plants", "pay the rent"],
          ["warm up", "run two kilometres", "stretch", "drink water", "rest"],
          ["mix the flour and water", "knead the dough", "let it rise", "shape the loaf", "bake for forty minutes"]]
RECORDS = [{"Name": "Jonas", "Age": "28", "City": "Oslo", "Job": "Teacher"},
           {"Title": "The Silent Forest", "Author": "A. Reyes", "Year": "2015", "Pages": "312"},
           {"Product": "Desk lamp", "Price": "24 euros", "Colour": "black", "Stock": "12"},
           {"Team": "Red Hawks", "Played": "10", "Won": "7", "Lost": "3"},
           {"City": "Nairobi", "Country": "Kenya", "Population": "4.4 million", "Altitude": "1,795 m"},
           {"Student": "Lea", "Maths": "A", "History": "B", "Art": "A"}]
NOTES = [
    "The swimming pool will be closed next Tuesday for repairs. Members can use the gym instead, and classes move to Thursday.",
    "Please bring a packed lunch on the school trip. The bus leaves at eight and returns at four. Wear comfortable shoes.",
    "The office printer is out of toner. A new cartridge has been ordered and should arrive on Wednesday.",
    "Our book club meets on the first Monday of every month. This month we are reading a mystery novel set in Venice.",
    "The farmers' market moves to the town square from June. It opens at nine on Saturdays and sells local cheese and fruit.",
    "Water will be switched off between ten and two on Friday while the pipes are replaced. Please store some water beforehand.",
    "The concert starts at seven thirty. Doors open at seven. Tickets bought online can be shown on a phone.",
]
ERRORS = ["he dont like apples and he never eat them", "me and my friend goes to the park every days",
          "the childs was playing in the garden yesterday", "i has three brother and one sister",
          "they was late because the bus come late", "she can sings very good", "we goed to the beach last summer",
          "there is many book on the table", "my dog run fastest than your dog", "he have finished his homeworks"]


class _Lists:
    """The word lists a generator draws from: the base lists, each extended by WIDE's when `wide`."""

    def __init__(self, wide: bool):
        for name, extension in WIDE.items():
            setattr(self, name, globals()[name] + (extension if wide else []))


def _pick(rng, xs):
    return xs[rng.randrange(len(xs))]


def _qa(rng, L):
    s = _pick(rng, L.SUBJECTS)
    return _pick(rng, [f"What is {s}?", f"Who first studied {s}?", f"Why is {s} important?",
                       f"What are the main facts about {s}?", f"Where can I see {s} in everyday life?",
                       f"How old is the idea of {s}?", f"What is a common misconception about {s}?",
                       f"Give me a short answer: what is {s}?", f"What is the difference between {' and '.join(_pick(rng, L.PAIRS))}?",
                       f"What is the difference between {' and '.join(_pick(rng, L.PAIRS))}? Answer in one sentence."])


def _explain(rng, L):
    s = _pick(rng, L.SUBJECTS)
    t = _pick(rng, L.THINGS)
    return _pick(rng, [f"Explain {s} in simple terms.", f"Explain {s} to {_pick(rng, L.PEOPLE)}.",
                       f"How does {t} work?", f"Explain how {t} works in three sentences.",
                       f"Can you explain {s} like I'm five?", f"Explain the basic idea behind {s}.",
                       f"Why does {t} need electricity? Explain briefly.", f"Explain {s} in one paragraph."])


def _howto(rng, L):
    a = _pick(rng, L.ACTIVITIES)
    return _pick(rng, [f"How do I {a}?", f"What is the best way to {a}?", f"Give me step-by-step instructions to {a}.",
                       f"I want to {a}. Where should I start?", f"What mistakes should I avoid when I {a}?",
                       f"How can {_pick(rng, L.PEOPLE)} {a}?", f"Explain how to {a} in five steps."])


def _list(rng, L):
    n = _pick(rng, ["three", "four", "five", "six", "seven", "ten"])
    s, a = _pick(rng, L.SUBJECTS), _pick(rng, L.ACTIVITIES)
    return _pick(rng, [f"List {n} facts about {s}.", f"Give me {n} tips to {a}.", f"Name {n} uses of {_pick(rng, L.THINGS)}.",
                       f"List {n} advantages and disadvantages of {s}.", f"What are {n} things to know about {s}?",
                       f"Make a list of {n} books or films about {s}.", f"List {n} ways to {a} on a budget.",
                       f"Write a bulleted list of {n} questions a student might ask about {s}."])


def _creative(rng, L):
    f, m, c = _pick(rng, L.FORMS), _pick(rng, L.MOODS), _pick(rng, L.CREATURES)
    s = _pick(rng, L.SUBJECTS)
    return _pick(rng, [f"Write a {m} {f} about {c}.", f"Write a short {f} about {s}.", f"Write a {f} about {c}.",
                       f"Write a four-line {f} about {s}.", f"Tell me a short story about {c}.",
                       f"Write the opening paragraph of a {m} story about {c}.", f"Write a {m} {f} about {s}.",
                       f"Invent a name and a short backstory for {c}."])


def _code(rng, L):
    lang, task = _pick(rng, L.LANGUAGES), _pick(rng, L.CODE_TASKS)
    c = _pick(rng, L.CODE_CONCEPTS)
    return _pick(rng, [f"Write a {lang} function that {task}.", f"Write a {lang} function that {task}, with a comment.",
                       f"Show me {lang} code that {task}.", f"What is {c} in programming? Give an example in {lang}.",
                       f"Explain {c} with a short {lang} example.", f"How do I write a {lang} program that {task}?",
                       f"Write a short {lang} snippet that {task}, and explain it in one sentence."])


def _math(rng, L):
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 12)
    n1, n2 = rng.sample(L.NAMES, 2)
    it = _pick(rng, L.ITEMS)
    return _pick(rng, [f"What is {a} + {b}?", f"What is {a} times {c}?", f"What is {a * c} divided by {c}?",
                       f"What is {c}% of {a * 10}?", f"{n1} has {a} {it} and gives {min(a, b) // 2} to {n2}. How many {it} does {n1} have left?",
                       f"{n1} buys {c} packs of {it} with {b} in each pack. How many {it} are there in total?",
                       f"A train travels {a * 10} km in {c} hours. What is its average speed?",
                       f"Solve for x: {c}x + {a} = {a + c * b}.", f"What is the square of {a}?",
                       f"Is {a * 2 + 1} a prime number? Explain.", f"Convert {a} kilometres to metres.",
                       f"{n1} is {a} years old and {n2} is {c} years older. How old is {n2}? Show your steps.",
                       f"What is the area of a rectangle {a} cm long and {c} cm wide?",
                       f"Round {a}.{b} to the nearest whole number.", f"What is {a} minus {b}?"])


def _rewrite(rng, L):
    return f"{_pick(rng, L.REWRITES)}: \"{_pick(rng, L.SENTENCES).capitalize()}.\""


def _copy(rng, L):
    k = rng.randint(1, 2)
    text = " ".join(s.capitalize() + "." for s in rng.sample(L.SENTENCES, k))
    return _pick(rng, [f"{_pick(rng, L.COPIES)}: {text}", f"{_pick(rng, L.COPIES)}:\n\n{text}",
                       f"Here is some text: \"{text}\" Please repeat it word for word.",
                       f"Summarize this in one sentence, then repeat the original: {text}"])


def _chat(rng, L):
    return _pick(rng, L.CHATS)


# Further templates of every kind (`--wide` only): each call picks these or the ones above evenly.
def _qa_w(rng, L):
    s, t = _pick(rng, L.SUBJECTS), _pick(rng, L.THINGS)
    a, b = _pick(rng, L.PAIRS)
    return _pick(rng, [f"What are the most important things to know about {s}?", f"How does {s} affect our daily lives?",
                       f"What would happen if there were no {s}?", f"Is {s} good or bad? Give both sides.",
                       f"Who uses {t}, and what for?", f"How is {a} different from {b}? Give an example of each.",
                       f"What do {a} and {b} have in common?", f"What is the history of {s} in a few sentences?",
                       f"Why do people find {s} interesting?", f"What is one surprising fact about {s}?",
                       f"Answer briefly: how does {t} help people?", f"What are the parts of {t}?"])


def _explain_w(rng, L):
    s, t, who = _pick(rng, L.SUBJECTS), _pick(rng, L.THINGS), _pick(rng, L.PEOPLE)
    return _pick(rng, [f"Explain {s} using an everyday comparison.", f"Explain what {t} does, in simple words.",
                       f"Describe how {t} works, step by step.", f"Explain {s} in two sentences.",
                       f"Teach me the basics of {s}.", f"Explain {s} to {who} in a short paragraph.",
                       f"What is {s}, and why does it matter? Keep it simple.", f"Describe {s} in plain English.",
                       f"Explain why {s} is useful, with two examples."])


def _howto_w(rng, L):
    a, who = _pick(rng, L.ACTIVITIES), _pick(rng, L.PEOPLE)
    n = _pick(rng, ["three", "four", "five", "six"])
    return _pick(rng, [f"Give me {n} simple steps to {a}.", f"What do I need to {a}?",
                       f"How long does it take to {a}, and how do I start?", f"Write numbered instructions to {a}.",
                       f"What is the easiest way to {a}?", f"Help me {a}. Keep it short.",
                       f"Give {who} advice on how to {a}.", f"What are common problems when you {a}, and how do I fix them?"])


def _list_w(rng, L):
    n = _pick(rng, ["three", "four", "five", "six", "seven", "eight", "ten"])
    s, t = _pick(rng, L.SUBJECTS), _pick(rng, L.THINGS)
    name, _ = _pick(rng, SEQUENCES)
    g = list(_pick(rng, GROUPS))
    rng.shuffle(g)
    return _pick(rng, [f"List {name}.", f"List {name}, then list them again backwards.",
                       f"Write {name} as a numbered list.", f"List {name}, separated by commas.",
                       f"List {n} animals that live in {_pick(rng, ['the ocean', 'the desert', 'the forest', 'the Arctic', 'Africa', 'a farm'])}.",
                       f"List {n} words that rhyme with {_pick(rng, ['cat', 'light', 'day', 'tree', 'rain', 'blue'])}.",
                       f"List {n} {_pick(rng, ['vegetables', 'fruits', 'countries', 'sports', 'musical instruments', 'jobs', 'colors', 'tools'])} in alphabetical order.",
                       f"Put these in alphabetical order: {', '.join(g)}.", f"Name {n} parts of {t}.",
                       f"List {n} key words about {s}, one per line.",
                       f"Count from {_pick(rng, ['ten', 'twenty', 'one hundred'])} down to {_pick(rng, ['one', 'zero'])}.",
                       f"Write the numbers from {rng.randint(1, 30)} to {rng.randint(35, 60)}, separated by commas."])


def _creative_w(rng, L):
    f, m, c, s = _pick(rng, L.FORMS), _pick(rng, L.MOODS), _pick(rng, L.CREATURES), _pick(rng, L.SUBJECTS)
    place = _pick(rng, ["a quiet library", "a train station at dawn", "a snowy mountain village", "a crowded beach",
                        "a school playground", "an old bookshop", "a space station", "a bakery at night", "a rainy city street"])
    return _pick(rng, [f"Describe {place} in a few sentences.", f"Write a {m} {f} set in {place}.",
                       f"Write a story in five sentences about {c}.", f"Write a {f} about {s} for children.",
                       f"Write a short dialogue between {c} and {_pick(rng, L.CREATURES)}.",
                       f"Write a {m} description of {place}.", f"Write a letter from {c} to a friend.",
                       f"Write a short, {m} poem about {s}.", f"Write a story that begins: \"{_pick(rng, L.SENTENCES).capitalize()}.\""])


def _code_w(rng, L):
    lang, task, c = _pick(rng, L.LANGUAGES), _pick(rng, L.CODE_TASKS), _pick(rng, L.CODE_CONCEPTS)
    return _pick(rng, [f"Write a function in {lang} that {task}.", f"Write {lang} code that {task}, and show an example call.",
                       f"Implement a function that {task}. Use {lang}.", f"Give me a {lang} example of {c}.",
                       f"What is the difference between {c} and {_pick(rng, L.CODE_CONCEPTS)}?",
                       f"Write a {lang} function that {task}, with a docstring or comment and a test.",
                       f"Explain what {c} means to a beginner programmer."])


def _math_w(rng, L):
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 12)
    n1, n2 = rng.sample(L.NAMES, 2)
    it = _pick(rng, L.ITEMS)
    return _pick(rng, [f"What is {a} + {b} + {c}?", f"What is {a * b} divided by {b}? Explain.",
                       f"Calculate {c} squared plus {a}.", f"What is half of {a * 2}?", f"Double {a}, then add {b}.",
                       f"{n1} reads {c} pages a day. How many pages does {n1} read in {b} days?",
                       f"A box holds {c} {it}. How many boxes are needed for {a * c} {it}?",
                       f"{n1} earns {a} euros and spends {min(a, b)}. How much is left? Show your work.",
                       f"A shop sells {it} for {c} euros each. How much do {b} of them cost?",
                       f"What is {b}% of {a * 4}? Show the calculation.", f"Which is larger, {a}/{c} or {b}/{c + 1}?",
                       f"Convert {a} hours into minutes.", f"What is the perimeter of a square with sides of {a} cm?",
                       f"{n1} and {n2} share {a * 2} {it} equally. How many does each get?"])


def _rewrite_w(rng, L):
    return _pick(rng, [f"{_pick(rng, L.REWRITES)}: \"{_pick(rng, L.SENTENCES).capitalize()}.\"",
                       f"Correct the grammar of this sentence: {_pick(rng, ERRORS)}.",
                       f"Fix the mistakes in this sentence and explain them: {_pick(rng, ERRORS)}.",
                       f"{_pick(rng, L.REWRITES)}: {_pick(rng, L.SENTENCES)}"])


def _copy_w(rng, L):
    g = list(_pick(rng, GROUPS))
    rec = _pick(rng, RECORDS)
    row = " | ".join(f"{k}: {v}" for k, v in rec.items())
    note = _pick(rng, NOTES)
    return _pick(rng, [f"Here are some items: {', '.join(g)}. Write them one per line.",
                       f"Turn this into a bulleted list: {', '.join(g)}.", f"Number these steps: {'; '.join(g)}.",
                       f"Write this list again in reverse order: {', '.join(g)}.",
                       f"Write this record as a full sentence: {row}.", f"Turn this into a short paragraph: {row}.",
                       f"Make a table with two columns from this: {row}.",
                       f"Read this note and summarize it in one sentence: \"{note}\"",
                       f"Here is a message: \"{note}\" List its key points.",
                       f"Copy this note exactly: {note}", f"Rewrite this note for a child: \"{note}\""])


WIDE_TEMPLATES = {"qa": _qa_w, "explain": _explain_w, "howto": _howto_w, "list": _list_w, "creative": _creative_w,
                  "code": _code_w, "math": _math_w, "rewrite": _rewrite_w, "copy": _copy_w, "chat": _chat}


CATEGORIES = [("qa", _qa, 3), ("explain", _explain, 3), ("howto", _howto, 2), ("list", _list, 2),
              ("creative", _creative, 2), ("code", _code, 2), ("math", _math, 2), ("rewrite", _rewrite, 1),
              ("copy", _copy, 1), ("chat", _chat, 1)]


def generate(count: int, seed: int, kinds: list[str] | None = None, wide: bool = False) -> list[dict]:
    """`count` distinct prompts, categories drawn by their weights (among `kinds` when given);
    deterministic for `seed` (and `kinds`, `wide`). `wide` draws from the extended lists and
    templates too; without it the output is what this file wrote before they existed."""
    rng = random.Random(seed)
    lists = _Lists(wide)
    known = [c for c, _, _ in CATEGORIES]
    unknown = [k for k in kinds or [] if k not in known]
    if unknown:
        raise SystemExit(f"unknown kind {unknown[0]!r}: the kinds are {', '.join(known)}")
    names = [c for c, _, w in CATEGORIES for _ in range(w) if not kinds or c in kinds]
    fns = {c: f for c, f, _ in CATEGORIES}
    seen, out, tries = set(), [], 0
    while len(out) < count:
        tries += 1
        if tries > 50 * count + 1000:
            raise SystemExit(f"only {len(out)} distinct prompts after {tries} tries: ask for fewer")
        cat = _pick(rng, names)
        fn = WIDE_TEMPLATES[cat] if wide and rng.random() < 0.5 else fns[cat]
        text = fn(rng, lists)
        if text in seen:
            continue
        seen.add(text)
        out.append({"id": f"p{len(out):05d}", "category": cat, "messages": [{"role": "user", "content": text}]})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kinds", default="", help="comma-separated categories to draw from (default: all, by weight)")
    p.add_argument("--wide", action="store_true",
                   help="draw from the extended word lists and templates too (earlier seeds without it are unchanged)")
    p.add_argument("--exclude", nargs="*", default=[],
                   help="prompt files (JSON lines) whose user turns are left out, kept out of training (held-out sets)")
    args = p.parse_args(argv)
    if args.count < 1:
        raise SystemExit("--count must be >= 1")
    held_out = set()
    for path in args.exclude:
        with open(path) as f:
            held_out.update(m["content"] for line in f if line.strip() for m in json.loads(line)["messages"] if m["role"] == "user")
    rows = [r for r in generate(args.count, args.seed, [k for k in args.kinds.split(",") if k] or None, args.wide)
            if r["messages"][0]["content"] not in held_out]
    with open(args.out, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"wrote {len(rows)} prompts to {args.out} ({args.count - len(rows)} left out)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
