"""Corpus and prompt shared by the LangChain tests (distinct topics, so retrieval is
unambiguous)."""

PASSAGES = [
    "Lionel Messi was born in Rosario and scored twice for Argentina in the final.",
    "The Eiffel Tower in Paris was finished in 1889 for the world fair.",
    "Photosynthesis turns sunlight, water and carbon dioxide into sugar in green leaves.",
    "The Python language was created by Guido van Rossum and first released in 1991.",
    "Mount Everest, the highest mountain on Earth, stands on the border of Nepal and China.",
    "Retrieval augmented generation reuses the key value cache of every chunk it retrieves.",
]
QUESTION = "Where was Lionel Messi born?"
TEMPLATE = "Answer from the passages below.\n{context}\nQuestion: {input}\nAnswer:"
