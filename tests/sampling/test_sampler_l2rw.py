"""Learning to reweight: the look-ahead derivative equals minus the gradient alignment."""
import torch

from nnunet_dro.weighting.learning_to_reweight import learning_to_reweight


def per_example_mse(outputs, targets):
    return ((outputs - targets) ** 2).mean(dim=1)


def test_weights_equal_normalised_positive_gradient_alignment():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    x, y = torch.randn(6, 3), torch.randn(6, 1)
    xv, yv = torch.randn(5, 3), torch.randn(5, 1)
    w = learning_to_reweight(model, per_example_mse, x, y, xv, yv, inner_lr=0.1)
    params = list(model.parameters())
    val_grad = torch.autograd.grad(per_example_mse(model(xv), yv).mean(), params)
    alignment = []
    for i in range(6):
        gi = torch.autograd.grad(per_example_mse(model(x[i:i + 1]), y[i:i + 1]).sum(), params)
        alignment.append(sum((a * b).sum() for a, b in zip(val_grad, gi)))
    expected = torch.clamp(0.1 * torch.stack(alignment), min=0)
    torch.testing.assert_close(w, expected / expected.sum(), rtol=1e-4, atol=1e-6)


def test_flipped_label_gets_zero_weight():
    torch.manual_seed(1)
    model = torch.nn.Linear(2, 1)
    with torch.no_grad():
        model.weight[:] = torch.tensor([[0.1, 0.1]])
        model.bias.zero_()
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, 0.5]])
    y = x.sum(dim=1, keepdim=True)                     # the clean rule: y = x1 + x2
    y_noisy = y.clone()
    y_noisy[3] = -y[3]                                 # a label error
    w = learning_to_reweight(model, per_example_mse, x, y_noisy, x[:3], y[:3], inner_lr=0.1)
    assert w[3] == 0 and torch.all(w[:3] > 0) and torch.isclose(w.sum(), torch.tensor(1.0))


def test_all_disagreeing_gives_zero_weights():
    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(0.0)
    x = torch.ones(2, 1)
    w = learning_to_reweight(model, per_example_mse, x, -x, x, x, inner_lr=0.1)
    assert torch.equal(w, torch.zeros(2))


class SharedEncoder(torch.nn.Module):
    """Like nnU-Net's U-Net: the decoder holds a reference to the encoder (a module seen twice)."""

    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Linear(2, 2)
        self.decoder = torch.nn.Module()
        self.decoder.encoder = self.encoder
        self.head = torch.nn.Linear(2, 1)

    def forward(self, x):
        return self.head(torch.tanh(self.decoder.encoder(x)))


def test_parameters_stay_leaves_when_a_module_is_shared():
    torch.manual_seed(2)
    model = SharedEncoder()
    before = {name: p for name, p in model.named_parameters()}
    x, y = torch.randn(4, 2), torch.randn(4, 1)
    learning_to_reweight(model, per_example_mse, x, y, x, y, inner_lr=0.1)
    after = dict(model.named_parameters())
    assert all(after[name] is before[name] and after[name].is_leaf for name in before)
    per_example_mse(model(x), y).mean().backward()  # a normal step still works
