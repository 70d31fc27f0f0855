from fermium.cli import app

app()
