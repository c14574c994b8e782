"""Serving the trained team with Ray Serve: per-agent deployments and a voting ingress (design §7).

    satseq serve --checkpoint-dir outputs/quickstart --port 8000
    curl -X POST localhost:8000/predict -H 'content-type: application/json' \\
         -d '{"problem": "Compute 3 + 4."}'
"""

# No imports here: a Serve replica unpickling `satseq.serving.agent` runs this file first, and
# the application module pulls in training code. Import from `satseq.serving.app`.
