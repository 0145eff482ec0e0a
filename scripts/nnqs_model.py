#!/usr/bin/env python3
"""Write a TorchScript model for sci.nnqs's `model_file`: the built-in network, in PyTorch.

sci.nnqs trains any TorchScript module whose forward(x) takes x, a (batch, 2 NORB) float64 tensor
of occupations (spin orbital 2p is orbital p's alpha, 2p + 1 its beta; 0 or 1), and returns
(log |psi|, phase), each (batch,). This script writes the network sci.nnqs has built in
(stages/nnqs/model/wavefunction.hpp: an autoregressive Transformer for |psi| whose conditionals
keep NELEC and MS2, an MLP for the phase) with the same parameter names, so that a user can start
from it and change it, and so that the weights a sci.nnqs output holds under /network load into
it.

Examples:
  # the built-in network for an FCIDUMP, fresh weights
  python3 scripts/nnqs_model.py --fcidump h2o_FCIDUMP -o model.pt
  # smaller, and with the weights a sci.nnqs run trained (its output's /network)
  python3 scripts/nnqs_model.py --fcidump h2o_FCIDUMP --embedding 16 --layers 2 --heads 2 \\
      --phase-hidden 64 64 --weights qstage-runs/sci-nnqs/outputs/nnqs.h5 -o model.pt
Then, in the spec: params: {fcidump: h2o_FCIDUMP, model_file: model.pt}.
Needs PyTorch (Debian: python3-torch, the version of the LibTorch qstage was built with) and,
for --weights, h5py.
"""
import argparse
import re
import sys
import warnings
from typing import List, Tuple

import torch
from torch import nn


class Wavefunction(nn.Module):
    """psi(x) = |psi(x)| exp(i phi(x)); see stages/nnqs/model/wavefunction.hpp."""

    def __init__(self, norb: int, nalpha: int, nbeta: int, embedding: int = 32, layers: int = 4, heads: int = 4,
                 phase_hidden: Tuple[int, ...] = (512, 512, 512)):
        super().__init__()
        self.norb, self.nalpha, self.nbeta = norb, nalpha, nbeta
        self.tokens = nn.Embedding(5, embedding)  # an orbital's 4 occupations, and the start token
        self.positions = nn.Embedding(norb, embedding)
        layer = nn.TransformerEncoderLayer(embedding, heads, dim_feedforward=4 * embedding, dropout=0.0,
                                           activation="gelu")
        self.decoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.logits = nn.Linear(embedding, 4)
        modules: List[nn.Module] = []
        width = 2 * norb
        for hidden in phase_hidden:
            modules += [nn.Linear(width, hidden), nn.GELU()]
            width = hidden
        modules.append(nn.Linear(width, 1))
        self.phase = nn.Sequential(*modules)
        self.register_buffer("causal", torch.triu(torch.full((norb, norb), float("-inf")), 1))
        self.register_buffer("remaining", (norb - 1) - torch.arange(norb))
        self.register_buffer("alpha_adds", torch.tensor([0, 1, 0, 1]))
        self.register_buffer("beta_adds", torch.tensor([0, 0, 1, 1]))

    def allowed(self, occupied: torch.Tensor, electrons: int, adds: torch.Tensor) -> torch.Tensor:
        # occupations of orbital k after which NELEC and MS2 stay reachable
        before = (occupied.cumsum(1) - occupied).unsqueeze(2)
        after = before + adds.view(1, 1, 4)
        return (after <= electrons) & ((electrons - after) <= self.remaining.view(1, -1, 1))

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        batch, n = x.shape[0], self.norb
        alpha = x[:, 0::2].long()
        beta = x[:, 1::2].long()
        states = alpha + 2 * beta  # 0 empty, 1 alpha, 2 beta, 3 both
        start = torch.full((batch, 1), 4, dtype=torch.long, device=x.device)
        inputs = torch.cat([start, states[:, : n - 1]], 1)
        h = self.tokens(inputs) + self.positions.weight.unsqueeze(0)
        h = self.decoder(h.transpose(0, 1), mask=self.causal).transpose(0, 1)
        logits = self.logits(h)
        allowed = self.allowed(alpha, self.nalpha, self.alpha_adds) & self.allowed(beta, self.nbeta, self.beta_adds)
        logits = logits.masked_fill(allowed.logical_not(), float("-inf"))
        log_p = torch.log_softmax(logits, 2).gather(2, states.unsqueeze(2)).squeeze(2)
        return 0.5 * log_p.sum(1), self.phase(2 * x - 1).squeeze(1)


def fcidump_header(path: str) -> Tuple[int, int, int]:
    """NORB, NELEC and MS2 of an FCIDUMP's namelist."""
    with open(path) as f:
        text = f.read(1 << 16)
    end = re.search(r"&END|\$END|^\s*/", text, re.IGNORECASE | re.MULTILINE)
    header = text[: end.start()] if end else text

    def value(key: str, default=None) -> int:
        m = re.search(rf"\b{key}\s*=\s*(-?\d+)", header, re.IGNORECASE)
        if m is None:
            if default is None:
                sys.exit(f"nnqs_model.py: {path} has no {key} in its namelist; expected an FCIDUMP")
            return default
        return int(m.group(1))

    return value("NORB"), value("NELEC"), value("MS2", 0)


def load_weights(model: nn.Module, path: str) -> None:
    """The parameters a sci.nnqs output holds under /network, by name."""
    import h5py

    with h5py.File(path, "r") as f:
        if "network" not in f:
            sys.exit(f"nnqs_model.py: {path} has no /network; expected a sci.nnqs output")
        # (through lists: PyTorch's numpy bridge fails where pip's numpy is not the one it was built with)
        saved = {name: torch.tensor(f["network"][name][()].tolist(), dtype=torch.float64) for name in f["network"]}
    ours = dict(model.named_parameters())
    if set(saved) != set(ours):
        sys.exit(f"nnqs_model.py: {path}'s /network has other parameters than this network "
                 f"(only there: {sorted(set(saved) - set(ours))[:3]}, only here: {sorted(set(ours) - set(saved))[:3]}); "
                 "expected the same sizes as the run's `model`")
    with torch.no_grad():
        for name, p in ours.items():
            if tuple(saved[name].shape) != tuple(p.shape):
                sys.exit(f"nnqs_model.py: {path}'s /network/{name} has shape {tuple(saved[name].shape)}; "
                         f"expected {tuple(p.shape)}")
            p.copy_(saved[name])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fcidump", required=True, help="the FCIDUMP the model is for (its NORB, NELEC, MS2)")
    parser.add_argument("--ms2", type=int, help="2 S_z of the state, if not the FCIDUMP's MS2")
    parser.add_argument("--embedding", type=int, default=32)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--phase-hidden", type=int, nargs="*", default=[512, 512, 512])
    parser.add_argument("--seed", type=int, default=1, help="the initial weights (PyTorch's, not sci.nnqs's)")
    parser.add_argument("--weights", help="a sci.nnqs output whose /network to load")
    parser.add_argument("-o", "--output", required=True, help="the TorchScript file to write")
    args = parser.parse_args()

    norb, nelec, ms2 = fcidump_header(args.fcidump)
    if args.ms2 is not None:
        ms2 = args.ms2
    if (nelec + ms2) % 2 or abs(ms2) > nelec:
        sys.exit(f"nnqs_model.py: NELEC {nelec} and MS2 {ms2} give no whole numbers of alpha and beta electrons")
    if args.embedding % args.heads:
        sys.exit(f"nnqs_model.py: --embedding {args.embedding} is not a multiple of --heads {args.heads}")
    torch.manual_seed(args.seed)
    model = Wavefunction(norb, (nelec + ms2) // 2, (nelec - ms2) // 2, args.embedding, args.layers, args.heads,
                         tuple(args.phase_hidden)).double()
    if args.weights:
        load_weights(model, args.weights)
    with warnings.catch_warnings():  # (PyTorch 1.13 warns of its own TransformerEncoderLayer's constants)
        warnings.simplefilter("ignore", UserWarning)
        scripted = torch.jit.script(model)
    torch.jit.save(scripted, args.output)
    print(f"{args.output}: {sum(p.numel() for p in model.parameters())} parameters, NORB {norb}, "
          f"{(nelec + ms2) // 2} alpha and {(nelec - ms2) // 2} beta electrons")


if __name__ == "__main__":
    main()
