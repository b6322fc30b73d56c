#!/usr/bin/perl
# Turns one kernels/*.cu file into host C++ for the cuda_cpu scheduler (cuda_runtime.h):
#   name<targs><<<cfg>>>(args);   ->   cucpu_launch(CUCPU_CFG(cfg), [=]() { name<targs>(args); });
# Nothing else changes, so the compiled code is the kernel source itself.
# usage: to_host.pl IN.cu OUT.cc
use strict;
use warnings;
my ($in, $out) = @ARGV;
open(my $fh, '<', $in) or die "to_host.pl: $in: $!\n";
local $/;
my $src = <$fh>;
close $fh;
my $parens = qr/(\((?:[^()]++|(?-1))*\))/;
my $count = ($src =~ s{((?:\w+::)*\w+(?:<[^<>;(){}]*>)?)\s*<<<(.*?)>>>\s*$parens\s*;}
                      {cucpu_launch(CUCPU_CFG($2), [=]() { $1$3; });}gs);
die "to_host.pl: $in: a <<< launch was left unconverted\n" if $src =~ /<<</;
open(my $oh, '>', $out) or die "to_host.pl: $out: $!\n";
print $oh "// Generated from $in by kernels/cuda_cpu/to_host.pl ($count launches).\n";
print $oh "#line 1 \"$in\"\n$src";
close $oh;
