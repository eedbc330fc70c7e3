"""diffusers on neuron, unchanged (issue 8): tiny UNet (DDPM) and DiT pipelines built from
configs with random weights run on the device and produce CPU's images."""
import numpy as np
import pytest
import torch

diffusers = pytest.importorskip("diffusers", reason="make installs the pinned Hugging Face packages")


@pytest.fixture(scope="module")
def ddpm_dir(tmp_path_factory):
    torch.manual_seed(0)
    unet = diffusers.UNet2DModel(sample_size=8, in_channels=3, out_channels=3, layers_per_block=1,
                                 block_out_channels=(16, 32), down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                                 up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=8,
                                 attention_head_dim=8)
    d = tmp_path_factory.mktemp("tiny-ddpm")
    diffusers.DDPMPipeline(unet=unet, scheduler=diffusers.DDPMScheduler(num_train_timesteps=20)).save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def dit_dir(tmp_path_factory):
    torch.manual_seed(0)
    transformer = diffusers.DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=8, in_channels=4,
                                                  out_channels=8, num_layers=2, sample_size=8, patch_size=2,
                                                  num_embeds_ada_norm=1000, norm_num_groups=8)
    vae = diffusers.AutoencoderKL(block_out_channels=(8,), in_channels=3, out_channels=3, latent_channels=4,
                                  norm_num_groups=8, sample_size=16, down_block_types=("DownEncoderBlock2D",),
                                  up_block_types=("UpDecoderBlock2D",))
    d = tmp_path_factory.mktemp("tiny-dit")
    diffusers.DiTPipeline(transformer=transformer, vae=vae, scheduler=diffusers.DDIMScheduler()).save_pretrained(d)
    return d


def _images(pipe, **kw):
    return pipe(generator=torch.Generator().manual_seed(0), output_type="np", **kw).images


def test_unet_pipeline_from_pretrained_device_map_matches_cpu(ddpm_dir):
    dev = diffusers.DiffusionPipeline.from_pretrained(ddpm_dir, device_map="neuron")
    cpu = diffusers.DiffusionPipeline.from_pretrained(ddpm_dir)
    assert dev.device.type == "neuron" and all(p.device.type == "neuron" for p in dev.unet.parameters())
    got, want = _images(dev, batch_size=2, num_inference_steps=20), _images(cpu, batch_size=2, num_inference_steps=20)
    assert got.shape == (2, 8, 8, 3) and np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_dit_pipeline_to_neuron_matches_cpu(dit_dir):
    cpu = diffusers.DiTPipeline.from_pretrained(dit_dir)
    want = _images(cpu, class_labels=[1, 3], num_inference_steps=4)  # with classifier-free guidance
    dev = cpu.to("neuron")
    assert dev.device.type == "neuron" and dev.vae.device.type == "neuron"
    got = _images(dev, class_labels=[1, 3], num_inference_steps=4)
    assert got.shape == want.shape and np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
