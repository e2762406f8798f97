"""Mimi, the streaming audio codec: 1920 samples (80 ms at 24 kHz) <-> 8 codes.

Encode: SEANet encoder (to 25 Hz latents), encoder transformer (two steps
per frame), learnt strided conv down to 12.5 Hz, split RVQ.  Decode: the
mirror image (RVQ lookup, channel-wise transposed conv up to 25 Hz, decoder
transformer, SEANet decoder).

The streams' state lives outside the module: ``state =
mimi.init_encoder_state(B)``, then ``mimi.encode_frame(pcm, state,
exec_mask)`` per frame (the same for the decoder); ``state.reset(mask)``
makes the masked rows fresh streams.

Streaming differs from a one-shot encode of a whole file (first-chunk
padding, the ring attention window); the streaming result is the reference.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from ._config import MimiConfig
from ._conv import ConvState, ConvTrState, Named, StreamingConv1d, StreamingConvTranspose1d
from ._quantizer import SplitResidualVQ
from ._seanet import SEANetDecoder, SEANetEncoder, StateList
from ._transformer import StreamingTransformer, TransformerState


@dataclasses.dataclass
class MimiEncoderState:
    """Per-row streaming state of Mimi's encoder: SEANet convs, transformer KV rings, the downsampling conv."""

    seanet: StateList
    transformer: TransformerState
    downsample: ConvState

    def reset(self, mask: torch.Tensor) -> None:
        """Put the rows selected by ``mask`` [B] back to fresh in every part, in place."""
        self.seanet.reset(mask)
        self.transformer.reset(mask)
        self.downsample.reset(mask)


@dataclasses.dataclass
class MimiDecoderState:
    """Per-row streaming state of Mimi's decoder: the upsampling conv, transformer KV rings, SEANet convs."""

    upsample: ConvTrState
    transformer: TransformerState
    seanet: StateList

    def reset(self, mask: torch.Tensor) -> None:
        """Put the rows selected by ``mask`` [B] back to fresh in every part, in place."""
        self.upsample.reset(mask)
        self.transformer.reset(mask)
        self.seanet.reset(mask)


class Mimi(nn.Module):
    """The Mimi codec: 24 kHz PCM to codebook tokens at 12.5 Hz and back, streamed frame by frame."""

    def __init__(self, cfg: MimiConfig):
        super().__init__()
        self.cfg = cfg
        if cfg.seanet.hop_length * cfg.resample_stride != cfg.frame_size:
            raise ValueError("Mimi's frame must be one hop of the SEANet times the resampling stride")
        dim = cfg.seanet.dimension
        stride = cfg.resample_stride
        self.encoder = SEANetEncoder(cfg.seanet)
        self.decoder = SEANetDecoder(cfg.seanet)
        self.encoder_transformer = Named("transformer", StreamingTransformer(cfg.transformer))
        self.decoder_transformer = Named("transformer", StreamingTransformer(cfg.transformer))
        self.quantizer = SplitResidualVQ(cfg.quantizer)
        self.downsample = Named("conv", StreamingConv1d(dim, dim, 2 * stride, stride, bias=False, pad_mode="replicate"))
        self.upsample = Named(
            "convtr",
            StreamingConvTranspose1d(
                dim, dim, 2 * stride, stride, groups=dim if cfg.upsample_channel_wise else 1, bias=False
            ),
        )

    @property
    def frame_size(self) -> int:
        """Samples per frame (1920: 80 ms at 24 kHz)."""
        return self.cfg.frame_size

    @property
    def num_codebooks(self) -> int:
        """Codebooks per frame that the encoder emits and the decoder reads."""
        return self.cfg.num_codebooks

    def refresh(self) -> None:
        """Recompute derived tensors (codebook vectors); call after loading weights."""
        self.quantizer.refresh()

    def init_encoder_state(self, batch_size: int) -> MimiEncoderState:
        """A fresh encoder state for ``batch_size`` rows."""
        return MimiEncoderState(
            seanet=self.encoder.init_state(batch_size),
            transformer=self.encoder_transformer.transformer.init_state(batch_size),
            downsample=self.downsample.conv.init_state(batch_size),
        )

    def init_decoder_state(self, batch_size: int) -> MimiDecoderState:
        """A fresh decoder state for ``batch_size`` rows."""
        return MimiDecoderState(
            upsample=self.upsample.convtr.init_state(batch_size),
            transformer=self.decoder_transformer.transformer.init_state(batch_size),
            seanet=self.decoder.init_state(batch_size),
        )

    @torch.no_grad()
    def encode_latent(
        self, pcm: torch.Tensor, state: MimiEncoderState, exec_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``pcm`` float ``[B, frame_size]`` to the latent before quantization, ``[B, dimension, 1]``."""
        if exec_mask is None:
            exec_mask = torch.ones(pcm.shape[0], dtype=torch.bool, device=pcm.device)
        x = pcm.to(self.downsample.conv.conv.conv.weight.dtype).unsqueeze(1)
        x = self.encoder(x, state.seanet, exec_mask)
        x = self.encoder_transformer.transformer(x.transpose(1, 2), state.transformer, exec_mask).transpose(1, 2)
        return self.downsample.conv(x, state.downsample, exec_mask)

    @property
    def stored_codebooks(self) -> int:
        """Codebooks the quantizer holds (32 for the real Mimi): the most :meth:`encode_frame` can emit."""
        return self.cfg.quantizer.n_q

    def encode_frame(
        self,
        pcm: torch.Tensor,
        state: MimiEncoderState,
        exec_mask: torch.Tensor | None = None,
        num_codebooks: int | None = None,
    ) -> torch.Tensor:
        """``pcm`` float ``[B, frame_size]`` to codes long ``[B, num_codebooks]`` (default: the codebooks used).

        One encode serves both models of a call: ``num_codebooks=32`` gives the
        speech-to-text model its 32 levels, and their first ``num_codebooks``
        (8) are bit for bit the codes of a default encode, because each
        residual level only reads the ones before it.

        Error handling: ``ValueError`` when more codebooks are asked than stored.
        """
        n = self.cfg.num_codebooks if num_codebooks is None else num_codebooks
        if not 0 < n <= self.stored_codebooks:
            raise ValueError(f"this Mimi stores {self.stored_codebooks} codebooks, {n} were asked")
        latent = self.encode_latent(pcm, state, exec_mask)
        # Levels past the speaking model's own (the speech-to-text's alone) take the cheaper distances.
        return self.quantizer.encode(latent, n, exact=min(n, self.cfg.num_codebooks))[:, :, 0]

    @torch.no_grad()
    def decode_frame(
        self, codes: torch.Tensor, state: MimiDecoderState, exec_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Codes long ``[B, num_codebooks]`` (each in ``0..bins-1``) to pcm float ``[B, frame_size]``."""
        if exec_mask is None:
            exec_mask = torch.ones(codes.shape[0], dtype=torch.bool, device=codes.device)
        x = self.quantizer.decode(codes.unsqueeze(-1))
        x = self.upsample.convtr(x, state.upsample, exec_mask)
        x = self.decoder_transformer.transformer(x.transpose(1, 2), state.transformer, exec_mask).transpose(1, 2)
        return self.decoder(x, state.seanet, exec_mask)[:, 0]
