from tiergate.training.cli import app

app()
