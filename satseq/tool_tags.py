"""The tool-use tags of design §5, spelled once.

The model writes code between CODE_OPEN and CODE_CLOSE (generation stops at CODE_CLOSE); the
sandbox's output comes back between INTERPRETER_OPEN and INTERPRETER_CLOSE, masked out of the
loss. The tokenizer keeps each tag a single token.
"""

CODE_OPEN, CODE_CLOSE = "<code>", "</code>"
INTERPRETER_OPEN, INTERPRETER_CLOSE = "<interpreter>", "</interpreter>"
TOOL_TAGS = (CODE_OPEN, CODE_CLOSE, INTERPRETER_OPEN, INTERPRETER_CLOSE)
