"""The model suite's registry (bench/bench_models.py): each model's small random-weight build and
its example inputs, from torchvision, timm and transformers; nothing is downloaded.

A builder returns (model, args, kwargs) on the CPU in float32; the caller seeds torch before it,
puts the model in eval mode and moves both to the device and dtype. Sizes are the smallest that
keep a family's structure: convolutional networks at their own width on 64x64 images (larger
where the network's fixed pooling or attention windows need it), transformers with 2 layers and
a hidden size of 64-128 where their constructors take it, batch 2.
"""
import re
from dataclasses import dataclass
from typing import Callable, Dict, List

import torch

SUITES = ("torchvision", "timm", "transformers")


@dataclass(frozen=True)
class ModelSpec:
    name: str
    suite: str
    family: str
    build: Callable  # () -> (model, args, kwargs)


MODELS: Dict[str, ModelSpec] = {}


def _add(name, suite, family, build):
    assert name not in MODELS, name
    MODELS[name] = ModelSpec(name, suite, family, build)


def _image(batch, size, channels=3):
    h, w = (size, size) if isinstance(size, int) else size
    return torch.randn(batch, channels, h, w)


# ---- torchvision ---------------------------------------------------------------------------


def _tv(builder, size=64, batch=2, **kw):
    def build():
        import torchvision.models as tvm

        return getattr(tvm, builder)(weights=None, **kw), (_image(batch, size),), {}

    return build


def _tv_class(make, inputs):
    """A torchvision model built from its class with a small configuration."""

    def build():
        return make(), (inputs(),), {}

    return build


def _tv_vit():
    from torchvision.models import VisionTransformer

    return VisionTransformer(image_size=64, patch_size=16, num_layers=2, num_heads=2,
                             hidden_dim=64, mlp_dim=128)


def _tv_swin(v2):
    from torchvision.models import swin_transformer as sw

    extra = dict(block=sw.SwinTransformerBlockV2, downsample_layer=sw.PatchMergingV2) if v2 else {}
    return sw.SwinTransformer(patch_size=[4, 4], embed_dim=32, depths=[2, 2, 2, 2],
                              num_heads=[1, 2, 4, 8], window_size=[4, 4],
                              stochastic_depth_prob=0.0, **extra)


def _tv_maxvit():
    from torchvision.models.maxvit import MaxVit

    return MaxVit(input_size=(64, 64), stem_channels=32, partition_size=2,
                  block_channels=[32, 64, 128, 256], block_layers=[1, 1, 1, 1], head_dim=16,
                  stochastic_depth_prob=0.0)


def _tv_mvit(v2):
    from torchvision.models.video.mvit import MViT, MSBlockConfig

    # mvit_v1_b's and mvit_v2_s's block patterns, one block per stage: v1 widens the block
    # before a stage's pooled-query block and pools queries only there; v2 widens in that block
    # and pools (stride 1) in every block.
    channels = ([(32, 32), (32, 64), (64, 128), (128, 256)] if v2 else
                [(32, 64), (64, 128), (128, 256), (256, 256)])
    heads = [1, 2, 4, 8]
    stride_kv = [[1, 8, 8], [1, 4, 4], [1, 2, 2], [1, 1, 1]]
    kernel_q = [[3, 3, 3]] * 4 if v2 else [[], [3, 3, 3], [3, 3, 3], [3, 3, 3]]
    stride_q = [[1, 1, 1] if v2 else [], [1, 2, 2], [1, 2, 2], [1, 2, 2]]
    blocks = [MSBlockConfig(num_heads=heads[i], input_channels=channels[i][0],
                            output_channels=channels[i][1], kernel_q=kernel_q[i],
                            kernel_kv=[3, 3, 3], stride_q=stride_q[i], stride_kv=stride_kv[i])
              for i in range(4)]
    extra = dict(residual_pool=v2, residual_with_cls_embed=not v2, rel_pos_embed=v2,
                 proj_after_attn=v2)
    return MViT(spatial_size=(64, 64), temporal_size=4, block_setting=blocks,
                stochastic_depth_prob=0.0, **extra)


def _tv_swin3d():
    from torchvision.models.video.swin_transformer import SwinTransformer3d

    return SwinTransformer3d(patch_size=[2, 4, 4], embed_dim=32, depths=[2, 2, 2, 2],
                             num_heads=[1, 2, 4, 8], window_size=[2, 4, 4],
                             stochastic_depth_prob=0.0)


def _tv_detection(builder, size=128, **kw):
    def build():
        import torchvision.models.detection as det

        m = getattr(det, builder)(weights=None, weights_backbone=None, **kw)
        return m, ([torch.rand(3, size, size), torch.rand(3, size, size)],), {}

    return build


def _tv_segmentation(builder, size=64):
    def build():
        import torchvision.models.segmentation as seg

        m = getattr(seg, builder)(weights=None, weights_backbone=None)
        return m, (_image(2, size),), {}

    return build


def _tv_video(builder, frames=8, size=64, batch=2):
    def build():
        import torchvision.models.video as video

        return (getattr(video, builder)(weights=None),
                (torch.randn(batch, 3, frames, size, size),), {})

    return build


def _tv_raft():
    from torchvision.models.optical_flow import raft_small

    return (raft_small(weights=None), (_image(2, 128), _image(2, 128)),
            {"num_flow_updates": 2})


for _name, _family in [
        ("resnet18", "resnet"), ("resnet50", "resnet"), ("resnext50_32x4d", "resnext"),
        ("wide_resnet50_2", "wide_resnet"), ("mobilenet_v2", "mobilenet"),
        ("mobilenet_v3_small", "mobilenet"), ("mobilenet_v3_large", "mobilenet"),
        ("efficientnet_b0", "efficientnet"), ("efficientnet_v2_s", "efficientnet_v2"),
        ("regnet_x_400mf", "regnet"), ("regnet_y_400mf", "regnet"), ("convnext_tiny", "convnext"),
        ("densenet121", "densenet"), ("shufflenet_v2_x0_5", "shufflenet"),
        ("squeezenet1_0", "squeezenet"), ("squeezenet1_1", "squeezenet"), ("mnasnet0_5", "mnasnet"),
        ("vgg11", "vgg"), ("vgg11_bn", "vgg"), ("alexnet", "alexnet")]:
    _add(_name, "torchvision", _family, _tv(_name))
_add("googlenet", "torchvision", "googlenet", _tv("googlenet", init_weights=True))
_add("inception_v3", "torchvision", "inception", _tv("inception_v3", size=96, init_weights=True))
_add("vit_b_16", "torchvision", "vit", _tv_class(_tv_vit, lambda: _image(2, 64)))
_add("swin_t", "torchvision", "swin", _tv_class(lambda: _tv_swin(False), lambda: _image(2, 128)))
_add("swin_v2_t", "torchvision", "swin", _tv_class(lambda: _tv_swin(True), lambda: _image(2, 128)))
_add("maxvit_t", "torchvision", "maxvit", _tv_class(_tv_maxvit, lambda: _image(2, 64)))
# Every box kept (random weights score ~1/91), at most 10 per image: the heads after the
# detector (masks, keypoints) run on a fixed handful of boxes.
_RCNN = dict(min_size=128, max_size=128, box_score_thresh=0.0, box_detections_per_img=10)
_ONE_STAGE = dict(score_thresh=0.0, detections_per_img=10)
for _name, _kw in [("fasterrcnn_resnet50_fpn", _RCNN), ("fasterrcnn_mobilenet_v3_large_fpn", _RCNN),
                   ("maskrcnn_resnet50_fpn", _RCNN), ("keypointrcnn_resnet50_fpn", _RCNN),
                   ("retinanet_resnet50_fpn", dict(min_size=128, max_size=128, **_ONE_STAGE)),
                   ("fcos_resnet50_fpn", dict(min_size=128, max_size=128, **_ONE_STAGE)),
                   ("ssdlite320_mobilenet_v3_large", dict(size=320, **_ONE_STAGE))]:
    _add(_name, "torchvision", "detection", _tv_detection(_name, **_kw))
_add("ssd300_vgg16", "torchvision", "detection",
     _tv_detection("ssd300_vgg16", size=300, **_ONE_STAGE))
_add("fcn_resnet50", "torchvision", "segmentation", _tv_segmentation("fcn_resnet50"))
_add("deeplabv3_resnet50", "torchvision", "segmentation", _tv_segmentation("deeplabv3_resnet50"))
_add("deeplabv3_mobilenet_v3_large", "torchvision", "segmentation",
     _tv_segmentation("deeplabv3_mobilenet_v3_large"))
_add("lraspp_mobilenet_v3_large", "torchvision", "segmentation",
     _tv_segmentation("lraspp_mobilenet_v3_large"))
_add("r3d_18", "torchvision", "video", _tv_video("r3d_18"))
_add("mc3_18", "torchvision", "video", _tv_video("mc3_18"))
_add("r2plus1d_18", "torchvision", "video", _tv_video("r2plus1d_18"))
# S3D's last pooling is a fixed 2x7x7 window: 16 frames of 224x224 at the least.
_add("s3d", "torchvision", "video", _tv_video("s3d", frames=16, size=224, batch=1))
_add("mvit_v1_b", "torchvision", "video",
     _tv_class(lambda: _tv_mvit(False), lambda: torch.randn(2, 3, 4, 64, 64)))
_add("mvit_v2_s", "torchvision", "video",
     _tv_class(lambda: _tv_mvit(True), lambda: torch.randn(2, 3, 4, 64, 64)))
_add("swin3d_t", "torchvision", "video",
     _tv_class(_tv_swin3d, lambda: torch.randn(2, 3, 4, 128, 128)))
_add("raft_small", "torchvision", "optical_flow", _tv_raft)


# ---- timm ----------------------------------------------------------------------------------


def _timm(name, size=64, batch=2, **kw):
    def build():
        import timm

        return timm.create_model(name, pretrained=False, **kw), (_image(batch, size),), {}

    return build


# (timm name, input size, constructor arguments): the family's smallest variant, transformers
# cut to 2 blocks where the constructor takes a depth, on the smallest image its fixed
# attention windows, position embeddings or pooling accept.
_TIMM = [
    ("resnet18", 64, {}),
    ("resnet50d", 64, {}),
    ("resnetv2_50", 64, {}),
    ("resnext26ts", 64, {}),
    ("seresnext26d_32x4d", 64, {}),
    ("legacy_seresnet18", 64, {}),
    ("skresnet18", 64, {}),
    ("res2net50_26w_4s", 64, {}),
    ("resnest14d", 64, {}),
    ("efficientnet_b0", 64, {}),
    ("efficientnet_lite0", 64, {}),
    ("tf_efficientnet_b0", 64, {}),
    ("efficientnetv2_rw_t", 64, {}),
    ("mobilenetv2_050", 64, {}),
    ("mobilenetv3_small_050", 64, {}),
    ("mobilenetv3_large_100", 64, {}),
    ("mobilenetv4_conv_small", 64, {}),
    ("mnasnet_small", 64, {}),
    ("fbnetv3_b", 64, {}),
    ("lcnet_050", 64, {}),
    ("tinynet_e", 64, {}),
    ("hardcorenas_a", 64, {}),
    ("ghostnet_050", 64, {}),
    ("ghostnetv2_100", 64, {}),
    ("rexnet_100", 64, {}),
    ("regnetx_002", 64, {}),
    ("regnety_002", 64, {}),
    ("regnetz_b16", 64, {}),
    ("convnext_atto", 64, {}),
    ("convnextv2_atto", 64, {}),
    ("densenet121", 64, {}),
    ("dla34", 64, {}),
    ("dla46_c", 64, {}),
    ("dpn48b", 64, {}),
    ("hrnet_w18_small", 64, {}),
    ("nf_resnet26", 64, {}),
    ("dm_nfnet_f0", 64, {}),
    ("nfnet_l0", 64, {}),
    ("cspresnet50", 64, {}),
    ("cspdarknet53", 64, {}),
    ("cs3darknet_s", 64, {}),
    ("darknet17", 64, {}),
    ("repvgg_a0", 64, {}),
    ("mobileone_s0", 64, {}),
    ("ese_vovnet19b_dw", 64, {}),
    ("selecsls42b", 64, {}),
    ("gernet_s", 64, {}),
    ("hgnet_tiny", 64, {}),
    ("hgnetv2_b0", 64, {}),
    ("inception_v3", 96, {}),
    ("inception_v4", 96, {}),
    ("xception41", 96, {}),
    ("vgg11", 64, {}),
    ("botnet26t_256", 256, {}),
    ("halonet26t", 256, {}),
    ("lambda_resnet26t", 256, {}),
    ("edgenext_xx_small", 64, {}),
    ("fastvit_t8", 64, {}),
    ("mobilevit_xxs", 64, {}),
    ("mobilevitv2_050", 64, {}),
    ("efficientvit_b0", 64, {}),
    ("efficientvit_m0", 224, {}),
    ("efficientformer_l1", 224, {}),
    ("efficientformerv2_s0", 224, {}),
    ("levit_128s", 224, {}),
    ("repvit_m1", 64, {}),
    ("starnet_s1", 64, {}),
    ("poolformer_s12", 64, {}),
    ("poolformerv2_s12", 64, {}),
    ("caformer_s18", 64, {}),
    ("inception_next_tiny", 64, {}),
    ("mambaout_femto", 64, {}),
    ("rdnet_tiny", 64, {}),
    ("vit_tiny_patch16_224", 64, {"img_size": 64, "depth": 2}),
    ("vit_small_patch16_rope_224", 64, {"img_size": 64, "depth": 2}),
    ("vit_relpos_small_patch16_224", 64, {"img_size": 64, "depth": 2}),
    ("deit_tiny_patch16_224", 64, {"img_size": 64, "depth": 2}),
    ("deit_tiny_distilled_patch16_224", 64, {"img_size": 64, "depth": 2}),
    ("deit3_small_patch16_224", 64, {"img_size": 64, "depth": 2}),
    ("beit_base_patch16_224", 64, {"img_size": 64, "depth": 2, "embed_dim": 96,
                                   "num_heads": 2}),
    ("eva02_tiny_patch14_224", 56, {"img_size": 56, "depth": 2}),
    ("cait_xxs24_224", 64, {"img_size": 64, "depth": 2}),
    ("xcit_nano_12_p16_224", 64, {"img_size": 64, "depth": 2}),
    ("convit_tiny", 64, {"img_size": 64, "depth": 2}),
    ("flexivit_small", 64, {"img_size": 64, "depth": 2}),
    ("vit_small_patch14_dinov2", 56, {"img_size": 56, "depth": 2}),
    ("vit_base_patch16_siglip_224", 64, {"img_size": 64, "depth": 2, "embed_dim": 96,
                                         "num_heads": 2}),
    ("pit_ti_224", 224, {}),
    ("tnt_s_patch16_224", 224, {}),
    ("crossvit_tiny_240", 240, {}),
    ("coat_lite_tiny", 224, {}),
    ("coat_tiny", 224, {}),
    ("twins_svt_small", 224, {}),
    ("twins_pcpvt_small", 224, {}),
    ("visformer_tiny", 224, {}),
    ("pvt_v2_b0", 64, {}),
    ("swin_tiny_patch4_window7_224", 224, {}),
    ("swinv2_cr_tiny_ns_224", 224, {}),
    ("swinv2_tiny_window8_256", 256, {}),
    ("maxvit_nano_rw_256", 256, {}),
    ("coatnet_nano_rw_224", 224, {}),
    ("davit_tiny", 64, {}),
    ("gcvit_xxtiny", 224, {}),
    ("nest_tiny", 224, {}),
    ("mvitv2_tiny", 224, {}),
    ("focalnet_tiny_srf", 64, {}),
    ("hiera_tiny_224", 224, {}),
    ("tiny_vit_5m_224", 224, {}),
    ("volo_d1_224", 224, {}),
    ("mixer_s16_224", 64, {"img_size": 64}),
    ("gmixer_12_224", 64, {"img_size": 64}),
    ("resmlp_12_224", 64, {"img_size": 64}),
    ("gmlp_ti16_224", 64, {"img_size": 64}),
    ("sequencer2d_s", 224, {}),
]
for _name, _size, _kw in _TIMM:
    _add(f"timm_{_name}", "timm", re.match(r"[a-z]+", _name).group(0), _timm(_name, _size, **_kw))


# ---- transformers --------------------------------------------------------------------------

_VOCAB = 1000
_SEQ = 32


def _ids(vocab=_VOCAB, seq=_SEQ):
    return torch.randint(3, vocab, (2, seq))


def _mask(seq=_SEQ):
    """Batch 2, the second sequence padded on the right by a quarter of its length."""
    m = torch.ones(2, seq, dtype=torch.long)
    m[1, seq - seq // 4:] = 0
    return m


def _text(**extra):
    return lambda: {"input_ids": _ids(), "attention_mask": _mask(), **extra}


def _seq2seq():
    return {"input_ids": _ids(), "attention_mask": _mask(), "decoder_input_ids": _ids(seq=8)}


def _hf(model_cls, config_cls, inputs, **config):
    def build():
        import transformers

        cfg = getattr(transformers, config_cls)(**config)
        return getattr(transformers, model_cls)(cfg), (), inputs()

    return build


# Special tokens inside the small vocabulary (some configs default to ids of the full one).
_TOKENS = dict(vocab_size=_VOCAB, pad_token_id=1, bos_token_id=0, eos_token_id=2)
_ENC = dict(vocab_size=_VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=128, max_position_embeddings=128)
_DEC = dict(_TOKENS, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
            use_cache=False)
_S2S = dict(_TOKENS, d_model=64, encoder_layers=2, decoder_layers=2,
            encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=128,
            decoder_ffn_dim=128, max_position_embeddings=128, use_cache=False,
            decoder_start_token_id=2)

_add("hf_bert", "transformers", "encoder", _hf("BertForMaskedLM", "BertConfig", _text(), **_ENC))
_add("hf_roberta", "transformers", "encoder",
     _hf("RobertaForMaskedLM", "RobertaConfig", _text(), **_ENC))
_add("hf_distilbert", "transformers", "encoder",
     _hf("DistilBertForMaskedLM", "DistilBertConfig", _text(), vocab_size=_VOCAB, dim=64,
         n_layers=2, n_heads=2, hidden_dim=128, max_position_embeddings=128))
_add("hf_albert", "transformers", "encoder",
     _hf("AlbertForMaskedLM", "AlbertConfig", _text(), embedding_size=32, **_ENC))
_add("hf_deberta_v2", "transformers", "encoder",
     _hf("DebertaV2ForMaskedLM", "DebertaV2Config", _text(), **_ENC))
_add("hf_electra", "transformers", "encoder",
     _hf("ElectraForPreTraining", "ElectraConfig", _text(), embedding_size=32, **_ENC))
_add("hf_mobilebert", "transformers", "encoder",
     _hf("MobileBertForMaskedLM", "MobileBertConfig", _text(), vocab_size=_VOCAB, hidden_size=64,
         embedding_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
         intra_bottleneck_size=32, true_hidden_size=32, max_position_embeddings=128))

_add("hf_gpt2", "transformers", "decoder",
     _hf("GPT2LMHeadModel", "GPT2Config", _text(), n_embd=64, n_layer=2, n_head=2,
         n_positions=128, use_cache=False, **_TOKENS))
_add("hf_gpt2_cache", "transformers", "decoder",
     _hf("GPT2LMHeadModel", "GPT2Config", _text(), n_embd=64, n_layer=2, n_head=2,
         n_positions=128, use_cache=True, **_TOKENS))
_add("hf_gpt_neo", "transformers", "decoder",
     _hf("GPTNeoForCausalLM", "GPTNeoConfig", _text(), vocab_size=_VOCAB, hidden_size=64,
         num_layers=2, num_heads=2, attention_types=[[["global", "local"], 1]], window_size=16,
         max_position_embeddings=128, use_cache=False))
_add("hf_gptj", "transformers", "decoder",
     _hf("GPTJForCausalLM", "GPTJConfig", _text(), vocab_size=_VOCAB, n_embd=64, n_layer=2,
         n_head=4, rotary_dim=8, n_positions=128, use_cache=False))
_add("hf_bloom", "transformers", "decoder",
     _hf("BloomForCausalLM", "BloomConfig", _text(), vocab_size=_VOCAB, hidden_size=64, n_layer=2,
         n_head=2, use_cache=False))
_add("hf_opt", "transformers", "decoder",
     _hf("OPTForCausalLM", "OPTConfig", _text(), vocab_size=_VOCAB, hidden_size=64,
         num_hidden_layers=2, num_attention_heads=2, ffn_dim=128, word_embed_proj_dim=64,
         max_position_embeddings=128, use_cache=False))
_add("hf_falcon", "transformers", "decoder",
     _hf("FalconForCausalLM", "FalconConfig", _text(), vocab_size=_VOCAB, hidden_size=64,
         num_hidden_layers=2, num_attention_heads=4, use_cache=False))
_add("hf_llama", "transformers", "decoder",
     _hf("LlamaForCausalLM", "LlamaConfig", _text(), **_DEC))
_add("hf_llama_cache", "transformers", "decoder",
     _hf("LlamaForCausalLM", "LlamaConfig", _text(), **{**_DEC, "use_cache": True}))
_add("hf_mistral", "transformers", "decoder",
     _hf("MistralForCausalLM", "MistralConfig", _text(), sliding_window=16, **_DEC))
_add("hf_qwen2", "transformers", "decoder",
     _hf("Qwen2ForCausalLM", "Qwen2Config", _text(), **_DEC))
_add("hf_qwen3", "transformers", "decoder",
     _hf("Qwen3ForCausalLM", "Qwen3Config", _text(), head_dim=16, **_DEC))
_add("hf_qwen3_moe", "transformers", "decoder",
     _hf("Qwen3MoeForCausalLM", "Qwen3MoeConfig", _text(), head_dim=16, num_experts=4,
         num_experts_per_tok=2, moe_intermediate_size=64, **_DEC))
_add("hf_gemma", "transformers", "decoder",
     _hf("GemmaForCausalLM", "GemmaConfig", _text(), head_dim=16, **_DEC))
_add("hf_gemma2", "transformers", "decoder",
     _hf("Gemma2ForCausalLM", "Gemma2Config", _text(), head_dim=16, sliding_window=16, **_DEC))
_add("hf_mixtral", "transformers", "decoder",
     _hf("MixtralForCausalLM", "MixtralConfig", _text(), num_local_experts=4,
         num_experts_per_tok=2, **_DEC))
_add("hf_phi", "transformers", "decoder",
     _hf("PhiForCausalLM", "PhiConfig", _text(), **_DEC))
_add("hf_phi3", "transformers", "decoder",
     _hf("Phi3ForCausalLM", "Phi3Config", _text(), **_DEC))

_add("hf_t5", "transformers", "seq2seq",
     _hf("T5ForConditionalGeneration", "T5Config", _seq2seq, vocab_size=_VOCAB, d_model=64,
         d_kv=16, d_ff=128, num_layers=2, num_heads=4, use_cache=False))
_add("hf_bart", "transformers", "seq2seq",
     _hf("BartForConditionalGeneration", "BartConfig", _seq2seq, **_S2S))
_add("hf_marian", "transformers", "seq2seq",
     _hf("MarianMTModel", "MarianConfig", _seq2seq, **_S2S))


def _audio():
    return {"input_values": torch.randn(2, 4000)}


def _whisper():
    return {"input_features": torch.randn(2, 80, 128), "decoder_input_ids": _ids(seq=8)}


_add("hf_wav2vec2", "transformers", "speech",
     _hf("Wav2Vec2ForCTC", "Wav2Vec2Config", _audio, vocab_size=32, hidden_size=64,
         num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, conv_dim=(32,) * 7,
         num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4))
_add("hf_hubert", "transformers", "speech",
     _hf("HubertModel", "HubertConfig", _audio, hidden_size=64, num_hidden_layers=2,
         num_attention_heads=2, intermediate_size=128, conv_dim=(32,) * 7,
         num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4))
_add("hf_whisper", "transformers", "speech",
     _hf("WhisperForConditionalGeneration", "WhisperConfig", _whisper, d_model=64,
         encoder_layers=2, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
         encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=80,
         max_source_positions=64, max_target_positions=64, use_cache=False,
         decoder_start_token_id=2, **_TOKENS))


def _pixels(size=64):
    return lambda: {"pixel_values": _image(2, size)}


def _clip():
    return {"input_ids": _ids(seq=16), "attention_mask": _mask(16), "pixel_values": _image(2, 64)}


_add("hf_vit", "transformers", "vision",
     _hf("ViTForImageClassification", "ViTConfig", _pixels(), image_size=64, patch_size=16,
         hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128))
_add("hf_clip", "transformers", "vision",
     _hf("CLIPModel", "CLIPConfig", _clip,
         text_config=dict(_TOKENS, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=2, max_position_embeddings=64),
         vision_config=dict(image_size=64, patch_size=16, hidden_size=64, intermediate_size=128,
                            num_hidden_layers=2, num_attention_heads=2), projection_dim=32))
_add("hf_swin", "transformers", "vision",
     _hf("SwinForImageClassification", "SwinConfig", _pixels(), image_size=64, patch_size=4,
         embed_dim=32, depths=[2, 2], num_heads=[2, 4], window_size=4))
_add("hf_convnext", "transformers", "vision",
     _hf("ConvNextForImageClassification", "ConvNextConfig", _pixels(),
         hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 2, 1]))
_add("hf_resnet", "transformers", "vision",
     _hf("ResNetForImageClassification", "ResNetConfig", _pixels(), embedding_size=32,
         hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 1, 1], layer_type="bottleneck"))
_add("hf_segformer", "transformers", "vision",
     _hf("SegformerForSemanticSegmentation", "SegformerConfig", _pixels(),
         hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], num_attention_heads=[1, 2, 2, 4],
         decoder_hidden_size=64))


def _detr():
    import transformers

    backbone = transformers.ResNetConfig(embedding_size=32, hidden_sizes=[32, 64, 128, 256],
                                         depths=[1, 1, 1, 1], layer_type="basic",
                                         out_features=["stage4"])
    cfg = transformers.DetrConfig(backbone_config=backbone, d_model=64, encoder_layers=2,
                                  decoder_layers=2, encoder_attention_heads=2,
                                  decoder_attention_heads=2, encoder_ffn_dim=128,
                                  decoder_ffn_dim=128, num_queries=10)
    return transformers.DetrForObjectDetection(cfg), (), {"pixel_values": _image(2, 64)}


_add("hf_detr", "transformers", "vision", _detr)


def select(names=None, suite="all") -> List[ModelSpec]:
    """The registry's models of `suite` ("all" for every suite) whose name is one of `names` or
    starts with one of them (a family prefix: "resnet", "timm_vit", "hf_"); all with no names."""
    specs = [s for s in MODELS.values() if suite == "all" or s.suite == suite]
    if not names:
        return specs
    chosen = [s for s in specs if any(s.name == n or s.name.startswith(n) for n in names)]
    unknown = [n for n in names if not any(s.name == n or s.name.startswith(n) for s in specs)]
    if unknown:
        raise SystemExit(f"bench_models: no model named or starting with {', '.join(unknown)}"
                         + ("" if suite == "all" else f" in the {suite} suite"))
    return chosen
