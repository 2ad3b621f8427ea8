"""The demo corpus's closed vocabulary: names, places, jobs, companies, years, fillers."""

from __future__ import annotations

FEMALE_FIRST = (
    "Lena", "Maria", "Sofia", "Anna", "Clara", "Nina", "Emma", "Julia", "Laura", "Sara",
    "Alice", "Hana", "Mei", "Priya", "Olga", "Rosa", "Elena", "Ines", "Yuki", "Amara",
    "Greta", "Ida", "Nora", "Zoe", "Lucia", "Maya", "Tara", "Vera", "Aisha", "Leila",
)
MALE_FIRST = (
    "Omar", "Ivan", "Paul", "Marco", "Tomas", "Lukas", "David", "Felix", "Hugo", "Oscar",
    "Kenji", "Ravi", "Diego", "Samuel", "Victor", "Jonas", "Mateo", "Pedro", "Emil", "Hassan",
    "Arjun", "Leon", "Noah", "Erik", "Bruno", "Kofi", "Stefan", "Oliver", "Rafael", "Adam",
)
LAST_NAMES = (
    "Park", "Diaz", "Novak", "Berg", "Costa", "Silva", "Tanaka", "Weber", "Rossi", "Khan",
    "Moreau", "Jensen", "Ortiz", "Kim", "Fischer", "Haddad", "Nowak", "Sato", "Lopez", "Varga",
    "Eriksen", "Mendes", "Okafor", "Petrov", "Quinn", "Reyes", "Singh", "Torres", "Ueda", "Vance",
    "Walsh", "Young", "Zhou", "Abbott", "Brandt", "Chen", "Dalton", "Ferreira", "Garcia", "Horvat",
)
CITIES = (
    "Oslo", "Lima", "Cairo", "Dublin", "Lisbon", "Seoul", "Nairobi", "Quito", "Vienna", "Prague",
    "Madrid", "Lagos", "Manila", "Hanoi", "Bogota", "Athens", "Berlin", "Tokyo", "Delhi", "Havana",
    "Riga", "Tunis", "Perth", "Denver", "Austin", "Boston", "Geneva", "Porto", "Kyoto", "Santiago",
)
JOBS = (
    "chemist", "pilot", "teacher", "nurse", "architect", "lawyer", "painter", "baker", "engineer",
    "farmer", "journalist", "dentist", "actor", "librarian", "surgeon", "plumber", "chef", "poet",
    "sailor", "judge",
)
COMPANIES = (
    "Norvex", "Altura", "Brightwell", "Corvane", "Delmar", "Estrix", "Fenwick", "Glenmoor",
    "Halvex", "Irondale", "Jaspera", "Kestrel", "Lumora", "Maxwell", "Nortech", "Orbis",
    "Pinecrest", "Quorra", "Redfield", "Solvane", "Trivex", "Umbra", "Veltra", "Westmark",
    "Xylon", "Yarrow", "Zentro", "Amberly", "Bluestone", "Cobalt",
)
COMPANY_TYPES = (
    "bank", "airline", "publisher", "shipyard", "brewery", "studio", "insurer", "carmaker",
    "pharmacy", "bakery", "mine", "hotel",
)
HOBBIES = (
    "chess", "tennis", "fishing", "gardening", "cycling", "swimming", "hiking", "cooking",
    "knitting", "golf", "surfing", "dancing", "rowing", "skiing", "archery", "singing",
)
PERSON_YEARS = tuple(str(y) for y in range(1940, 2000))
COMPANY_YEARS = tuple(str(y) for y in range(1850, 1940))
PLACE_YEARS = tuple(str(y) for y in range(1900, 2000))
FILLERS = (
    "The weather was mild that year.",
    "Many visitors come in the summer.",
    "The local paper wrote about it twice.",
    "Nobody expected such a quiet start.",
    "The old bridge nearby is still in use.",
    "Prices in the area rose quickly.",
    "The streets there are narrow and busy.",
    "A small park lies across the road.",
    "The rainy season lasts for months.",
    "Trains to the coast leave every hour.",
    "The town hall was painted green.",
    "Most shops close early on Sundays.",
)
PLACE_TEMPLATES = (
    "The museum in {city} opened in {year}.",
    "A new stadium was built in {city} in {year}.",
    "The old harbor of {city} was rebuilt in {year}.",
    "{city} hosted a large festival in {year}.",
)
