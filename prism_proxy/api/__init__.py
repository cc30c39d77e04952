"""What clients send: the OpenAI, SGLang-native and prism-hint bodies as pydantic models."""
