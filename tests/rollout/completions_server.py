"""A tiny OpenAI-compatible /v1/completions server for tests: a real HTTP server on localhost that
samples from its *own copy* of a tiny model (so it is a stale sampler, like llama.cpp's server), with
an admin POST /reload {"path"} that loads an exported checkpoint."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch
from transformers import AutoModelForCausalLM

from rlvr.rollout import SamplingParams
from rlvr.rollout.native import NativeEngine


class CompletionsServer:
    def __init__(self, model, tokenizer, name: str = "tiny"):
        self.model, self.tokenizer, self.name = model, tokenizer, name
        self.engine = NativeEngine(model, tokenizer)
        self.lock = threading.Lock()
        self.requests: list[dict] = []
        self.reloads: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def _send(self, code: int, obj: dict) -> None:
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == "/v1/models":
                    self._send(
                        200,
                        {
                            "object": "list",
                            "data": [{"id": server.name, "object": "model"}],
                        },
                    )
                else:
                    self._send(404, {"error": "not found"})

            def do_POST(self):
                payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/v1/completions":
                    self._send(200, server.complete(payload))
                elif self.path == "/reload":
                    server.reload(payload["path"])
                    self._send(200, {"ok": True})
                else:
                    self._send(404, {"error": "not found"})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def complete(self, payload: dict) -> dict:
        self.requests.append(payload)
        sampling = SamplingParams(
            temperature=payload.get("temperature", 1.0),
            top_p=payload.get("top_p", 1.0),
            top_k=max(0, payload.get("top_k", 0)),
            min_p=payload.get("min_p", 0.0),
            repetition_penalty=payload.get("repetition_penalty", 1.0),
            max_tokens=payload["max_tokens"],
            stop=tuple(payload.get("stop") or ()),
            seed=payload.get("seed"),
        )
        with self.lock, torch.no_grad():
            out = self.engine.generate([payload["prompt"]], payload.get("n", 1), sampling)
        choices = [
            {
                "index": i,
                "text": c.text,
                "token_ids": c.token_ids,
                "finish_reason": c.finish_reason,
                "logprobs": {
                    "tokens": [self.tokenizer.decode([t]) for t in c.token_ids],
                    "token_logprobs": c.logprobs,
                },
            }
            for i, c in enumerate(out)
        ]
        return {"object": "text_completion", "model": self.name, "choices": choices}

    def reload(self, path: str) -> None:
        fresh = AutoModelForCausalLM.from_pretrained(path)
        with self.lock:
            self.model.load_state_dict(fresh.state_dict())
        self.reloads.append(path)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
