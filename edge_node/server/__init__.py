"""The edge node's HTTP server: the OpenAI endpoints, answer shapes, structured output, drain, metrics, registration."""
